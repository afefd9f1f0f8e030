"""EnvService: the one session service that both REST and gRPC adapt.

API (all methods are coroutines; batch-first, answered per item, in order)::

    service = EnvService(Settings(workers=2))
    await service.start()                      # or: async with EnvService(...) as service:
    await service.list_envs()   -> list[EnvSpec]
    await service.create(items) -> list[SessionReply | ServiceError]   items: SessionOptions | dict
    await service.reset(items)  -> list[SessionReply | ServiceError]   items: ResetItem | dict
    await service.step(items)   -> list[SessionReply | ServiceError]   items: StepItem | dict
    await service.get(ids)      -> list[SessionReply | ServiceError]   the last reply, nothing applied
    await service.close(ids)    -> list[ServiceError | None]           None: closed
    await service.fork(items)   -> list[list[SessionReply] | ServiceError]  items: ForkItem | dict
    await service.frame(id)     -> bytes (PNG of the latest image shown); raises ServiceError
    await service.health()      -> dict (status, sessions, workers with pids, limits, ...)
    service.metrics.render()    -> Prometheus text
    await service.stop()

Items are the models of `models.py` as an adapter parsed them, or plain dicts (validated
here, one by one, so a bad item gets its own INVALID_ARGUMENT naming the field and the
others go on), or the ServiceError of an item an adapter could not parse (answered as
it is, in its place). Single-session calls are batches of one. `ServiceError(code,
message, field)` carries the wire error codes of docs/wire.md; `error.http_status` gives
the HTTP status.

How it works: environments live in worker processes (`worker.py`; the processes, the
pipe to them and its batching are `pool.py`), sessions are pinned to the least-loaded
worker at creation, and this (API) process only routes:
one batch call sends ONE message per worker holding all its items (the typed messages
of `messages.py`) and awaits the workers concurrently. A step's reward is assembled
in this process (`rewards.py`): from what the worker measured, the LLM judge's scores
and the reasoning guard's penalty (judges and guards live here). A worker that dies takes only its own sessions (they answer
SESSION_LOST, also for calls in flight) and is replaced. Sessions have server-made
ids (naming this server: session_ids.py), an idle timeout (a reaper task), a cap (CAPACITY), and a
`step_index` retry cache: a step repeated with the previous index is answered from
memory, never applied twice; concurrent calls on one session are serialised.
"""

from __future__ import annotations

import asyncio
import dataclasses
import gc
import logging
import time
from collections.abc import Iterable, Mapping, Sequence, Sized
from typing import Any, TypeVar

from pydantic import BaseModel, ValidationError

from env_server.reasoning import ReasoningConfig

from .messages import (
    Close,
    Create,
    Fork,
    Forked,
    Frame,
    ListEnv,
    Reset,
    Step,
)
from .metrics import Metrics
from .models import (
    MAX_FORKS,
    SEED_LIMIT,
    EnvSpec,
    ForkItem,
    ResetItem,
    ServiceError,
    SessionOptions,
    SessionReply,
    StepItem,
)
from .pool import WorkerHandle, WorkerPool
from .protocol import check_batch, check_env, validate
from .rewards import Rewards, writable
from .session_ids import Origin
from .sessions import Session, Sessions, step_key
from .settings import Settings

M = TypeVar("M", bound=BaseModel)
log = logging.getLogger("visenv.service")


class EnvService:
    """Sessions over worker processes; see the module docstring for the API."""

    def __init__(self, settings: Settings | None = None) -> None:
        self.settings = settings or Settings()
        self.metrics = Metrics()
        self.origin = Origin.here(self.settings.node_id)  # named in every session id
        self.sessions = Sessions(self.origin, self.settings.lost_memory)
        self.pool = WorkerPool(self.settings, self.metrics, self._on_worker_lost)
        self.env_specs: dict[str, EnvSpec] = {}
        self._reaper: asyncio.Task | None = None
        self._started_at = time.monotonic()
        self.rewards = Rewards(self.settings.judge_urls)
        # set once `start` has finished (or failed: then `_start_error`): the server listens
        # before that, and calls made meanwhile wait for it (`wait_started`)
        self._started = asyncio.Event()
        self._start_error: ServiceError | None = None

    # ---- lifecycle ------------------------------------------------------------------
    async def start(self) -> None:
        try:
            await self._start()
        except BaseException as exc:
            self._start_error = ServiceError("UNAVAILABLE", f"the server failed to start: {exc}")
            raise
        finally:
            self._started.set()

    async def wait_started(self) -> None:
        """Wait (briefly) until `start` has finished; UNAVAILABLE if it failed or takes long."""
        if not self._started.is_set():
            try:
                await asyncio.wait_for(self._started.wait(), self.settings.deadline)
            except TimeoutError:
                raise ServiceError("UNAVAILABLE", "the server is still starting; retry") from None
        if self._start_error is not None:
            raise self._start_error

    def envs_ready(self) -> dict[str, bool]:
        """Per enabled environment: whether every running worker can serve it without a
        warm-up (pre-warmed, or nothing to warm); False for all while the server starts."""
        alive = [w for w in self.workers if w.alive]
        started = self._started.is_set() and self._start_error is None and bool(alive)
        return {
            name: started and not any(name in w.warming for w in alive)
            for name, spec in sorted(self.env_specs.items())
            if spec.enabled
        }

    async def wait_ready(self, timeout: float | None = None) -> dict[str, bool]:
        """Wait until every enabled environment is ready (or `timeout` s); `envs_ready()`."""
        await asyncio.wait_for(self._started.wait(), timeout)
        loop = asyncio.get_running_loop()
        end = None if timeout is None else loop.time() + timeout
        while not all((ready := self.envs_ready()).values()) and self._start_error is None:
            if end is not None and loop.time() > end:
                break
            await asyncio.sleep(0.05)
        return ready

    async def _start(self) -> None:
        await self.pool.start()
        from env_server.core import registry

        names = sorted(set(registry.names()) | set(self.settings.env_paths))
        unknown = sorted(set(self.settings.envs or ()) - set(names))
        if unknown:
            await self.stop()
            raise ValueError(f"unknown environment(s) {unknown}; known: {names}")
        wanted = set(self.settings.envs or names)
        specs = await self.workers[0].request([ListEnv(n) for n in names])
        for pos, spec in enumerate(specs):  # a broken env module lists as unavailable
            if isinstance(spec, ServiceError):
                specs[pos] = EnvSpec(names[pos], "", False, spec.message, {}, None)
        self.env_specs = {s.name: s for s in specs}
        for name, spec in self.env_specs.items():
            spec.enabled = name in wanted and spec.available
        if self.settings.idle_timeout > 0:
            self._reaper = asyncio.create_task(self._reap_loop(), name="session-reaper")
        # everything made so far (modules, the app) lives as long as the process: out of
        # every later collection, which then scans only sessions and requests (a full
        # collection of the start-up heap took 100-300 ms, the p99 of a batch-64 step)
        gc.freeze()

    @property
    def workers(self) -> list[WorkerHandle]:
        return self.pool.workers

    @property
    def worker_restarts(self) -> int:
        return self.pool.restarts

    async def stop(self) -> None:
        if self._reaper is not None:
            self._reaper.cancel()
        await self.pool.stop()
        await self.rewards.aclose()
        self.sessions.clear()
        self.metrics.sessions.set(0)

    async def __aenter__(self) -> EnvService:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()

    # ---- the API --------------------------------------------------------------------
    async def list_envs(self) -> list[EnvSpec]:
        await self.wait_started()
        return list(self.env_specs.values())

    def limits(self) -> dict[str, Any]:
        """The limits this server holds every request to, on every transport (published at
        GET /v1/limits, in GET /v1/envs and /health); docs/wire.md explains each."""
        settings = self.settings
        return {
            "max_request_bytes": settings.max_request_bytes,
            "max_batch_items": settings.max_batch_items,
            "max_actions_per_step": settings.max_actions_per_step,
            "max_forks_per_item": MAX_FORKS,
            "max_sessions": settings.max_sessions,
            "items_per_worker_message": self.pool.piece_items(),
            "seed": {"type": "integer", "minimum": 0, "maximum": SEED_LIMIT - 1},
        }

    def _check_batch(self, items: Sized, field: str = "items") -> None:
        """Refuse a call of more items than `max_batch_items`, at once, naming the limit."""
        try:
            check_batch(items, self.settings.max_batch_items, field)
        except ServiceError as error:
            self.metrics.errors.labels(error.code).inc()
            raise

    async def create(
        self, items: Sequence[SessionOptions | Mapping[str, Any]]
    ) -> list[SessionReply | ServiceError]:
        self._check_batch(items)
        await self.wait_started()
        results: list[Any] = [None] * len(items)
        planned: dict[WorkerHandle, list[tuple[int, Session]]] = {}
        for pos, raw in enumerate(items):
            options = validate(SessionOptions, raw)
            if isinstance(options, ServiceError):
                results[pos] = options
                continue
            error = check_env(self.env_specs, options.env)
            try:
                reasoning = ReasoningConfig.model_validate(options.reasoning)
            except ValidationError as exc:
                error = error or ServiceError.from_validation(exc, "reasoning")
            else:
                error = error or self.rewards.check_judge(reasoning)
            if error is None and len(self.sessions) >= self.settings.max_sessions:
                error = ServiceError(
                    "CAPACITY",
                    f"the server holds its maximum of {self.settings.max_sessions} sessions; "
                    "close some or retry later",
                )
            worker = self.pool.pick() if error is None else None
            if error is None and worker is None:
                error = ServiceError("UNAVAILABLE", "no worker process is running; retry shortly")
            if error is not None:
                results[pos] = error
                continue
            session = self.sessions.reserve(worker, options, reasoning)
            planned.setdefault(worker, []).append((pos, session))

        async def run(worker: WorkerHandle, group: list[tuple[int, Session]]) -> None:
            batch = [Create(s.id, s.options, s.reasoning) for _, s in group]
            answers = await self.pool.call(worker, batch, [s.env for _, s in group])
            for (pos, session), answer in zip(group, answers, strict=True):
                results[pos] = answer
                if isinstance(answer, SessionReply):
                    session.last_reply, results[pos] = writable(answer)
                    self.metrics.resets.labels(session.env).inc()
                else:
                    self.sessions.forget(session)
                self.sessions.release(session)

        # shielded: a caller that gives up (client gone) must not leave a step applied in
        # the worker but unrecorded here (the step_index would drift)
        await asyncio.shield(asyncio.gather(*(run(w, g) for w, g in planned.items())))
        self.metrics.sessions.set(len(self.sessions))
        return self._count_errors(results)

    async def reset(
        self, items: Sequence[ResetItem | Mapping[str, Any]]
    ) -> list[SessionReply | ServiceError]:
        def message(item: ResetItem, session: Session) -> Reset:
            return Reset(session.id, item.seed, item.image_encoding)

        def applied(item: ResetItem, session: Session, reply: SessionReply) -> None:
            session.step_index = 0
            session.last_reply = reply
            session.last_step = None
            self.metrics.resets.labels(session.env).inc()

        return await self._session_call(ResetItem, items, message, applied)

    async def step(
        self, items: Sequence[StepItem | Mapping[str, Any]]
    ) -> list[SessionReply | ServiceError]:
        started = time.perf_counter()

        most = self.settings.max_actions_per_step

        def precheck(item: StepItem, session: Session) -> SessionReply | ServiceError | None:
            if item.actions is not None and len(item.actions) > most:
                return ServiceError(
                    "INVALID_ARGUMENT",
                    f"actions: {len(item.actions)} actions in one step, over this server's "
                    f"limit of {most} (max_actions_per_step, GET /v1/limits)",
                    "actions",
                )
            if item.step_index == session.step_index:
                return None  # apply it
            if item.step_index == session.step_index - 1 and session.last_reply is not None:
                if session.last_step is not None and step_key(item) != session.last_step:
                    return ServiceError(
                        "INVALID_ARGUMENT",
                        f"step_index {item.step_index} of {session.id} was already applied with "
                        "a different body; a retry must resend the same body (it then gets the "
                        f"stored reply), a new turn must use step_index {session.step_index}",
                        "step_index",
                    )
                return session.last_reply  # a retry: answered from memory
            return ServiceError(
                "FAILED_PRECONDITION",
                f"step_index {item.step_index} is not the next step of {session.id}: "
                f"expected {session.step_index}",
                "step_index",
            )

        def message(item: StepItem, session: Session) -> Step:
            return Step(session.id, item.response, item.actions, item.image_encoding)

        def applied(item: StepItem, session: Session, reply: SessionReply) -> None:
            session.step_index += 1
            session.last_reply = reply
            session.last_step = step_key(item)
            self.metrics.steps.labels(session.env).inc()

        results = await self._session_call(
            StepItem, items, message, applied, precheck, self.rewards.grade
        )
        self.metrics.step_seconds.observe(time.perf_counter() - started)
        return results

    async def get(self, session_ids: Sequence[str]) -> list[SessionReply | ServiceError]:
        await self.wait_started()
        self._check_batch(session_ids, "session_ids")
        results: list[SessionReply | ServiceError] = []
        for session_id in session_ids:
            session = self.sessions.lookup(session_id)
            if isinstance(session, Session):
                if session.busy is not None:
                    await asyncio.shield(session.busy)
                session.last_used = time.monotonic()
                if session.last_reply is None:
                    session = ServiceError("SESSION_LOST", f"session {session_id} is gone")
                else:
                    session = session.last_reply
            results.append(session)
        return self._count_errors(results)

    async def close(self, session_ids: Sequence[str]) -> list[ServiceError | None]:
        await self.wait_started()
        self._check_batch(session_ids, "session_ids")
        results: list[Any] = [None] * len(session_ids)
        planned: dict[WorkerHandle, list[tuple[int, Session]]] = {}
        for pos, session_id in enumerate(session_ids):
            session = self.sessions.lookup(session_id)
            if isinstance(session, ServiceError):
                results[pos] = session
                continue
            closed = ServiceError("NOT_FOUND", f"session {session_id} was closed", "session_id")
            self.sessions.forget(session, closed)
            planned.setdefault(session.worker, []).append((pos, session))

        async def run(worker: WorkerHandle, group: list[tuple[int, Session]]) -> None:
            batch, envs = [Close(s.id) for _, s in group], [s.env for _, s in group]
            answers = await self.pool.call(worker, batch, envs)
            for (pos, _), answer in zip(group, answers, strict=True):
                # SESSION_LOST: the environment went with its worker, closed all the same
                lost = isinstance(answer, ServiceError) and answer.code == "SESSION_LOST"
                results[pos] = None if lost else answer

        # shielded: a caller that gives up (client gone) must not leave a step applied in
        # the worker but unrecorded here (the step_index would drift)
        await asyncio.shield(asyncio.gather(*(run(w, g) for w, g in planned.items())))
        self.metrics.sessions.set(len(self.sessions))
        return self._count_errors(results)

    async def fork(
        self, items: Sequence[ForkItem | Mapping[str, Any]]
    ) -> list[list[SessionReply] | ServiceError]:
        """Each item makes `n` new sessions in its source's exact state, on its worker.

        A fork copies the environment (snapshot, restored into a fresh instance), the turn
        and episode counters, the step_index, the last observation and last reply (so a
        retried step answers from memory on the fork too), and the reasoning guard's
        window: the guard counts responses over the sessions of one config, and a fork gets
        its own copy of the source's guard (a fork's later responses are counted in its
        copy only), so a fork is penalised exactly as its source would be. An item is
        answered whole: its n replies (the source's last reply under each fork's id, with
        info["fork"] = {source, exact, tolerance}), or one error: CAPACITY when n more
        sessions don't fit under the cap, FAILED_PRECONDITION when the env can't snapshot.
        """
        await self.wait_started()
        self._check_batch(items)
        results: list[Any] = [None] * len(items)
        targets: list[tuple[int, ForkItem, Session]] = []
        seen: set[str] = set()
        for pos, raw in enumerate(items):
            item = validate(ForkItem, raw)
            if isinstance(item, ServiceError):
                results[pos] = item
                continue
            source = self.sessions.lookup(item.session_id)
            if isinstance(source, ServiceError):
                results[pos] = source
            elif source.id in seen:
                results[pos] = ServiceError(
                    "INVALID_ARGUMENT",
                    f"session {source.id} appears twice in one fork batch; ask for n forks once",
                    "session_id",
                )
            else:
                seen.add(source.id)
                targets.append((pos, item, source))

        while busy := [s.busy for _, _, s in targets if s.busy is not None]:
            await asyncio.wait(busy)
        loop = asyncio.get_running_loop()
        planned: dict[WorkerHandle, list[tuple[int, Session, list[Session]]]] = {}
        for pos, item, source in targets:
            if self.sessions.get(source.id) is not source or source.last_reply is None:
                results[pos] = self.sessions.lookup(source.id)
                continue
            source.last_used = time.monotonic()
            room = self.settings.max_sessions - len(self.sessions)
            if item.n > room:
                results[pos] = ServiceError(
                    "CAPACITY",
                    f"forking {source.id} {item.n} times needs {item.n} sessions, but the "
                    f"server has room for {max(room, 0)} under its cap of "
                    f"{self.settings.max_sessions}; close some or ask for fewer",
                    "n",
                )
                continue
            source.busy = loop.create_future()
            forks = []
            for _ in range(item.n):
                fork = self.sessions.reserve(
                    source.worker,
                    source.options,
                    source.reasoning,
                    step_index=source.step_index,
                    last_step=source.last_step,
                )
                forks.append(fork)
            planned.setdefault(source.worker, []).append((pos, source, forks))

        async def run(worker: WorkerHandle, group: list[tuple[int, Session, list[Session]]]):
            try:
                batch = [Fork(source.id, tuple(f.id for f in forks)) for _, source, forks in group]
                envs = [source.env for _, source, _ in group]
                answers = await self.pool.call(worker, batch, envs)
                for (pos, source, forks), answer in zip(group, answers, strict=True):
                    if isinstance(answer, ServiceError):
                        results[pos] = answer
                        for fork in forks:
                            self.sessions.forget(fork)
                        continue
                    results[pos] = [self._forked(source, fork, answer) for fork in forks]
            finally:
                for _, source, forks in group:
                    for session in (source, *forks):
                        self.sessions.release(session)

        # shielded: sessions the worker made must be recorded here even if the caller leaves
        await asyncio.shield(asyncio.gather(*(run(w, g) for w, g in planned.items())))
        self.metrics.sessions.set(len(self.sessions))
        return self._count_errors(results)

    def _forked(self, source: Session, fork: Session, answer: Forked) -> SessionReply:
        """Record a fork the worker made; its reply."""
        assert source.last_reply is not None
        self.rewards.fork_guard(source, fork)
        tolerance = answer.tolerance
        info = {
            **source.last_reply.info,
            "fork": {"source": source.id, "exact": tolerance is None, "tolerance": tolerance},
        }
        # also what a get() or a retry of the source's last step answers on the fork
        fork.last_reply = dataclasses.replace(source.last_reply, session_id=fork.id, info=info)
        return fork.last_reply

    async def frame(self, session_id: str) -> bytes:
        await self.wait_started()
        session = self.sessions.lookup(session_id)
        if isinstance(session, ServiceError):
            raise session
        session.last_used = time.monotonic()
        answer = (await self.pool.call(session.worker, [Frame(session.id)], [session.env]))[0]
        if isinstance(answer, ServiceError):
            raise answer
        return answer

    async def health(self) -> dict[str, Any]:
        ready = self.envs_ready()
        if not self._started.is_set():
            status = "starting"
        elif self._start_error is not None or not any(w.alive for w in self.workers):
            status = "degraded"
        else:
            status = "ok" if all(ready.values()) else "warming"
        return {
            "status": status,
            # per enabled environment: served without a warm-up (a startup/readiness probe
            # waits for the ones it needs; `status` is "ok" once all are)
            "ready": ready,
            "limits": self.limits(),
            "sessions": len(self.sessions),
            "max_sessions": self.settings.max_sessions,
            "idle_timeout_s": self.settings.idle_timeout,
            "envs": sorted(n for n, s in self.env_specs.items() if s.enabled),
            "workers": [
                {
                    "index": w.index,
                    "pid": w.pid,
                    "alive": w.alive,
                    "sessions": len(w.sessions),
                    # requests and the messages that carried them (coalesced: fewer messages)
                    "requests": w.requests_sent,
                    "messages": w.messages_sent,
                    "prewarmed": w.warmed,
                }
                for w in self.workers
            ],
            "worker_restarts": self.worker_restarts,
            "uptime_s": round(time.monotonic() - self._started_at, 3),
            "node": self.origin.node,  # as in its session ids: gateways route by it
            "boot": self.origin.boot,
        }

    # ---- internals ------------------------------------------------------------------
    async def _session_call(self, model, items, message, applied, precheck=None, post=None):
        """Validate, serialise per session, route one message per worker, record.

        `message(item, session)`: the worker message of an item."""
        await self.wait_started()
        self._check_batch(items)
        results: list[Any] = [None] * len(items)
        targets: list[tuple[int, Any, Session]] = []
        seen: set[str] = set()
        for pos, raw in enumerate(items):
            item = validate(model, raw)
            if isinstance(item, ServiceError):
                results[pos] = item
                continue
            session = self.sessions.lookup(item.session_id)
            if isinstance(session, ServiceError):
                results[pos] = session
            elif session.id in seen:
                results[pos] = ServiceError(
                    "INVALID_ARGUMENT",
                    f"session {session.id} appears twice in one batch",
                    "session_id",
                )
            else:
                seen.add(session.id)
                targets.append((pos, item, session))

        # wait for calls in flight on these sessions, then mark them busy (no await between)
        while busy := [s.busy for _, _, s in targets if s.busy is not None]:
            await asyncio.wait(busy)
        planned: dict[WorkerHandle, list[tuple[int, Any, Session]]] = {}
        loop = asyncio.get_running_loop()
        for pos, item, session in targets:
            if self.sessions.get(session.id) is not session:  # closed or lost meanwhile
                results[pos] = self.sessions.lookup(session.id)
                continue
            session.last_used = time.monotonic()
            early = precheck(item, session) if precheck is not None else None
            if early is not None:
                results[pos] = early
                continue
            session.busy = loop.create_future()
            planned.setdefault(session.worker, []).append((pos, item, session))

        async def run(worker: WorkerHandle, group: list[tuple[int, Any, Session]]) -> None:
            try:
                answers = await self.pool.call(
                    worker, [message(i, s) for _, i, s in group], [s.env for _, _, s in group]
                )
                if post is not None:
                    answers = await post(group, answers)
                for (pos, item, session), answer in zip(group, answers, strict=True):
                    results[pos] = answer
                    if isinstance(answer, SessionReply):
                        stored, results[pos] = writable(answer)
                        applied(item, session, stored)
                    elif isinstance(answer, ServiceError) and answer.code == "INTERNAL":
                        # the worker dropped it (its env is in an unknown state): so do we
                        self.sessions.forget(session, ServiceError(
                            "SESSION_LOST",
                            f"session {session.id} ended on internal error {answer.error_id}; "
                            "create a new session",
                        ))  # fmt: skip
                        self.metrics.sessions.set(len(self.sessions))
            finally:
                for _, _, session in group:
                    self.sessions.release(session)

        # shielded: a caller that gives up (client gone) must not leave a step applied in
        # the worker but unrecorded here (the step_index would drift)
        await asyncio.shield(asyncio.gather(*(run(w, g) for w, g in planned.items())))
        return self._count_errors(results)

    def _count_errors(self, results: Iterable[Any]) -> list:
        results = list(results)
        for result in results:
            if isinstance(result, ServiceError):
                self.metrics.errors.labels(result.code).inc()
        return results

    def _on_worker_lost(self, handle: WorkerHandle) -> None:
        """A worker died: its sessions are lost (the pool replaces it)."""
        lost = ServiceError(
            "SESSION_LOST",
            f"the session's worker process (pid {handle.pid}) died; create a new session",
        )
        for session_id in list(handle.sessions):
            session = self.sessions.get(session_id)
            if session is not None:
                self.sessions.forget(session, lost)
        self.metrics.sessions.set(len(self.sessions))

    async def _reap_loop(self) -> None:
        timeout = self.settings.idle_timeout
        interval = min(max(timeout / 4, 0.05), 30.0)
        while True:
            await asyncio.sleep(interval)
            await self.reap_idle(timeout)

    async def reap_idle(self, timeout: float) -> list[str]:
        """Close the sessions idle for longer than `timeout` seconds; their ids."""
        idle = self.sessions.idle(timeout)
        if not idle:
            return []
        ids = [s.id for s in idle]
        limit = self.settings.max_batch_items
        for start in range(0, len(ids), limit):
            await self.close(ids[start : start + limit])
        for session_id in ids:
            self.sessions.remember(
                session_id,
                ServiceError(
                    "NOT_FOUND", f"session {session_id} was closed after {timeout:g} s idle"
                ),
            )
        self.metrics.reaped.inc(len(ids))
        return ids
