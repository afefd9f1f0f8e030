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
others go on), or the ServiceError of an item an adapter could not parse (answered in
its place). Single-session calls are batches of one. `ServiceError(code, message,
field)` carries the wire error codes of docs/wire.md (`error.http_status`: HTTP's).

How it works: environments live in worker processes; this (API) process only routes.
`EnvService` coordinates three parts, one module each:

- `pool.py`, the worker pool: the processes (`worker.py` runs in each), both ends of the
  pipe, batching (one batch call sends ONE message per worker holding all its items, the
  typed messages of `messages.py`, and awaits the workers concurrently), deadlines, and
  restarts: a worker that dies takes only its own sessions (they answer SESSION_LOST,
  also for calls in flight) and is replaced;
- `sessions.py`, the sessions: server-made ids (naming this server: session_ids.py),
  pinned to the least-loaded worker at creation, with a cap (CAPACITY), an idle timeout
  (a reaper task here) and the memory of the sessions that are gone;
- `rewards.py`: a step's reward, assembled in this process from what the worker
  measured, the LLM judge's scores and the reasoning guard's penalty.

Every call on sessions (create, reset, step, close, fork) is written out below as plain
code over the same steps (`calls.py`: validate, claim the sessions, send, record), so
concurrent calls on one session are serialised; a step repeated with the previous
`step_index` is answered from memory (`Session.check_step_index`), never applied twice.
"""

from __future__ import annotations

import asyncio
import dataclasses
import gc
import logging
import time
from collections.abc import Iterable, Mapping, Sequence, Sized
from typing import Any

from pydantic import ValidationError

from env_server.reasoning import ReasoningConfig

from .calls import Sent, claim, looked_up, send, validated
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
    MAX_ACTION_ARGS,
    MAX_FORKS,
    MAX_JSON_DEPTH,
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
from .protocol import check_actions, check_batch, check_env
from .rewards import Rewards, writable
from .session_ids import Origin
from .sessions import Session, Sessions, step_key
from .settings import Settings

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
        self._children: dict[tuple[Any, str], Any] = {}  # labelled metrics (`_counter`)
        # set once `start` has finished (or failed: then `_start_error`): the server listens
        # before that, and calls made meanwhile wait for it (`wait_started`)
        self._started = asyncio.Event()
        self._start_error: ServiceError | None = None
        self.draining = False  # `drain`: no new sessions; the open ones go on

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
        names = self._known()
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
        # the start-up heap lives as long as the process: out of every later collection
        # (a full one of it took 100-300 ms, the p99 of a batch-64 step)
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

    def drain(self) -> None:
        """Take no new sessions (a create answers UNAVAILABLE; forks of open sessions, part
        of their episodes, still go) and serve the open ones as before. `/health` says
        `draining` and counts them, so whoever drains a server (SIGUSR1 to `visenv serve`,
        `visenv ray scale`) stops it at zero."""
        self.draining = True

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
            "max_json_depth": MAX_JSON_DEPTH,
            "max_action_args": MAX_ACTION_ARGS,
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
        results = await self._begin(items)
        todo = []
        for pos, options in validated(items, SessionOptions, results):
            session = self._new_session(options)
            if isinstance(session, ServiceError):
                results[pos] = session
            else:
                message = Create(session.id, session.options, session.reasoning)
                todo.append(Sent(pos, options, session, message))
        await send(self.pool, self.sessions, todo, results, self._created)
        return self._finished(results)

    def _new_session(self, options: SessionOptions) -> Session | ServiceError:
        """A new session for the options, reserved on the least-loaded worker; or why not."""
        error = check_env(self.env_specs, options.env)
        try:
            reasoning = ReasoningConfig.model_validate(options.reasoning)
        except ValidationError as exc:
            error = error or ServiceError.from_validation(exc, "reasoning")
        else:
            error = error or self.rewards.check_judge(reasoning)
        if error is None and self.draining:
            error = ServiceError("UNAVAILABLE", "the server is draining: it takes no new sessions")
        if error is None and len(self.sessions) >= self.settings.max_sessions:
            error = ServiceError(
                "CAPACITY",
                f"the server holds its maximum of {self.settings.max_sessions} sessions; "
                "close some or retry later",
            )
        worker = self.pool.pick() if error is None else None
        if error is None and worker is None:
            error = ServiceError("UNAVAILABLE", "no worker process is running; retry shortly")
        return error or self.sessions.reserve(worker, options, reasoning)

    async def _created(self, part: list[Sent], answers: list, results: list) -> None:
        for sent, answer in zip(part, answers, strict=True):
            if isinstance(answer, SessionReply):
                sent.session.last_reply, results[sent.pos] = writable(answer)
                self._counter(self.metrics.resets, sent.session.env).inc()
            else:
                self.sessions.forget(sent.session)  # the worker made none
                results[sent.pos] = answer

    async def reset(
        self, items: Sequence[ResetItem | Mapping[str, Any]]
    ) -> list[SessionReply | ServiceError]:
        results = await self._begin(items)
        found = await claim(
            self.sessions, looked_up(self.sessions, items, ResetItem, results), results
        )
        todo = [
            Sent(pos, item, session, Reset(session.id, item.seed, item.image_encoding))
            for pos, item, session in found
        ]
        await send(self.pool, self.sessions, todo, results, self._was_reset)
        return self._finished(results)

    async def _was_reset(self, part: list[Sent], answers: list, results: list) -> None:
        for sent, answer in zip(part, answers, strict=True):
            session = sent.session
            if isinstance(answer, SessionReply):
                session.last_reply, results[sent.pos] = writable(answer)
                session.step_index = 0
                session.last_step = None
                self._counter(self.metrics.resets, session.env).inc()
            else:
                results[sent.pos] = self._failed(session, answer)

    async def step(
        self, items: Sequence[StepItem | Mapping[str, Any]]
    ) -> list[SessionReply | ServiceError]:
        started = time.perf_counter()
        results = await self._begin(items)
        found = await claim(
            self.sessions, looked_up(self.sessions, items, StepItem, results), results
        )
        todo = []
        for pos, item, session in found:
            early = check_actions(
                self.env_specs[session.env], item.actions, self.settings.max_actions_per_step
            ) or session.check_step_index(item)  # an error, or a retry's stored reply
            if early is not None:
                results[pos] = early
            else:
                message = Step(session.id, item.response, item.actions, item.image_encoding)
                todo.append(Sent(pos, item, session, message))
        await send(self.pool, self.sessions, todo, results, self._stepped)
        self.metrics.step_seconds.observe(time.perf_counter() - started)
        return self._finished(results)

    async def _stepped(self, part: list[Sent], answers: list, results: list) -> None:
        answers = await self.rewards.grade(part, answers)  # the reward, assembled
        for sent, answer in zip(part, answers, strict=True):
            session = sent.session
            if isinstance(answer, SessionReply):
                session.last_reply, results[sent.pos] = writable(answer)
                session.step_index += 1
                session.last_step = step_key(sent.item)
                self._counter(self.metrics.steps, session.env).inc()
            else:
                results[sent.pos] = self._failed(session, answer)

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
        """A close forgets the session at once (a later call on it, or its id again in
        this batch, gets NOT_FOUND: closed), then the worker closes its environment after
        any call in flight on it."""
        return await self._close(session_ids, "was closed")

    async def _close(self, session_ids: Sequence[str], why: str) -> list[ServiceError | None]:
        """`close`, a later call on a session answering "session <id> <why>"."""
        results = await self._begin(session_ids, "session_ids")
        found = []
        for pos, session_id in enumerate(session_ids):
            session = self.sessions.lookup(session_id)
            if isinstance(session, Session):  # forgotten at once, the reason remembered
                closed = ServiceError("NOT_FOUND", f"session {session_id} {why}", "session_id")
                self.sessions.forget(session, closed)
            found.append((pos, session_id, session))
        found = await claim(self.sessions, found, results, closing=True)
        todo = [Sent(pos, sid, session, Close(session.id)) for pos, sid, session in found]
        await send(self.pool, self.sessions, todo, results, self._closed)
        return self._finished(results)

    async def _closed(self, part: list[Sent], answers: list, results: list) -> None:
        for sent, answer in zip(part, answers, strict=True):
            # SESSION_LOST: the environment went with its worker, closed all the same
            lost = isinstance(answer, ServiceError) and answer.code == "SESSION_LOST"
            results[sent.pos] = None if lost else answer

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
        results = await self._begin(items)
        found = await claim(
            self.sessions,
            looked_up(self.sessions, items, ForkItem, results),
            results,
            "appears twice in one fork batch; ask for n forks once",
        )
        todo = []
        for pos, item, source in found:
            forks = self._reserve_forks(item, source)
            if isinstance(forks, ServiceError):
                results[pos] = forks
            else:
                message = Fork(source.id, tuple(f.id for f in forks))
                todo.append(Sent(pos, item, source, message, held=forks))
        await send(self.pool, self.sessions, todo, results, self._forks_made)
        return self._finished(results)

    def _reserve_forks(self, item: ForkItem, source: Session) -> tuple[Session, ...] | ServiceError:
        """The `item.n` new sessions of a fork, reserved on its source's worker; or why not."""
        if source.last_reply is None:
            return ServiceError("SESSION_LOST", f"session {source.id} is gone")
        room = self.settings.max_sessions - len(self.sessions)
        if item.n > room:
            return ServiceError(
                "CAPACITY",
                f"forking {source.id} {item.n} times needs {item.n} sessions, but the "
                f"server has room for {max(room, 0)} under its cap of "
                f"{self.settings.max_sessions}; close some or ask for fewer",
                "n",
            )
        return tuple(
            self.sessions.reserve(
                source.worker,
                source.options,
                source.reasoning,
                step_index=source.step_index,
                last_step=source.last_step,
            )
            for _ in range(item.n)
        )

    async def _forks_made(self, part: list[Sent], answers: list, results: list) -> None:
        for sent, answer in zip(part, answers, strict=True):
            if isinstance(answer, ServiceError):
                for fork in sent.held:
                    self.sessions.forget(fork)
                results[sent.pos] = answer
            else:
                results[sent.pos] = [self._forked(sent.session, f, answer) for f in sent.held]

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

    def _known(self) -> list[str]:  # every environment it could serve
        from env_server.core import registry

        return sorted(set(registry.names()) | set(self.settings.env_paths))

    def offered(self) -> list[str]:
        """The environments sessions may ask for: the enabled ones; while starting, those
        asked for (none made clients that place by /health skip a starting server)."""
        if self.env_specs:
            return sorted(n for n, s in self.env_specs.items() if s.enabled)
        return sorted(self.settings.envs or self._known())

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
            # per enabled env: served without a warm-up (`status` is "ok" once all are)
            "ready": ready,
            "limits": self.limits(),
            "sessions": len(self.sessions),
            "draining": self.draining,
            "max_sessions": self.settings.max_sessions,
            "idle_timeout_s": self.settings.idle_timeout,
            "envs": self.offered(),
            "workers": [
                {
                    "index": w.index,
                    "pid": w.pid,
                    "alive": w.alive,
                    "sessions": len(w.sessions),
                    "requests": w.requests_sent,  # and the messages that carried them
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
    # Every call on sessions takes the same steps, in order (`calls.py`; create makes its
    # sessions instead of looking them up, close forgets them before it waits):
    #   _begin      refuse an oversized call; wait until the service has started
    #   validated   each item as its model (a bad one answers its own INVALID_ARGUMENT)
    #   claim       one item per session; wait for the calls in flight on those sessions
    #               (calls on one session are serialised), then drop the ones gone meanwhile
    #   send        mark them busy, send each worker its items (in pieces), hand each piece
    #               of answers to the operation's recorder as it comes, release the sessions
    async def _begin(self, items: Sized, field: str = "items") -> list[Any]:
        """The results of a call of `items` (filled in by the steps), once it may go."""
        self._check_batch(items, field)
        await self.wait_started()
        return [None] * len(items)

    def _failed(self, session: Session, answer: Any) -> Any:
        """A reset's or step's answer other than a reply: an INTERNAL error means the
        worker dropped the session (its env is in an unknown state), so do we."""
        if isinstance(answer, ServiceError) and answer.code == "INTERNAL":
            self.sessions.forget(session, ServiceError(
                "SESSION_LOST",
                f"session {session.id} ended on internal error {answer.error_id}; "
                "create a new session",
            ))  # fmt: skip
        return answer

    def _counter(self, metric: Any, label: str) -> Any:
        """`metric.labels(label)`, looked up once (prometheus checks the labels per call:
        1 us, for every step of a batch)."""
        key = (metric, label)
        child = self._children.get(key)
        if child is None:
            child = self._children[key] = metric.labels(label)
        return child

    def _finished(self, results: list) -> list:
        """A call on sessions is over: the sessions gauge, the errors counted; its results."""
        self.metrics.sessions.set(len(self.sessions))
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
        for start in range(0, len(ids), limit):  # (forgotten with the reason at once, while
            # the close may still wait for a busy worker)
            await self._close(ids[start : start + limit], f"was closed after {timeout:g} s idle")
        self.metrics.reaped.inc(len(ids))
        return ids
