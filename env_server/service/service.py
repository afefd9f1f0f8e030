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

Every call on sessions (create, reset, step, close, fork) takes one path,
`_per_session`: a `step_index` retry cache answers a step repeated with the previous
index from memory (never applied twice), and concurrent calls on one session are
serialised.
"""

from __future__ import annotations

import asyncio
import dataclasses
import gc
import logging
import time
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence, Sized
from dataclasses import dataclass, field
from typing import Any

from pydantic import ValidationError

from env_server.reasoning import ReasoningConfig

from .messages import (
    Close,
    Create,
    Fork,
    Forked,
    Frame,
    ListEnv,
    Message,
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
from .protocol import check_batch, check_env, validate
from .rewards import Rewards, writable
from .session_ids import Origin
from .sessions import Session, Sessions, step_key
from .settings import Settings

log = logging.getLogger("visenv.service")


@dataclass
class _Call:
    """What one kind of call on sessions does on the one path (`EnvService._per_session`)."""

    model: type  # what an item is validated as (str: a session id)
    message: Callable[[Any, Session], Message]  # the worker message of an item
    # record a reply the worker answered (the session keeps `writable`'s copy)
    applied: Callable[[Any, Session, SessionReply], None] | None
    # the item's session (None: looked up by item.session_id); create makes one
    find: Callable[[Any], Session | ServiceError | None] = lambda item: None
    # once no call is in flight on the session: an answer without the worker, or None
    admit: Callable[[Any, Session], Any] | None = None
    # the caller's result for any other answer (default: `EnvService._failed`)
    otherwise: Callable[[Any, Session, Any], Any] | None = None
    post: Callable[[list, list], Awaitable[list]] | None = None  # e.g. grading steps
    # sessions reserved with an item's session (by its id), busy and released with it
    held: Mapping[str, list[Session]] = field(default_factory=dict)
    twice: str = "appears twice in one batch"  # the error of an id given twice
    closes: bool = False  # close: `find` forgets the session (it is not live after the wait)


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
        def find(options: SessionOptions) -> Session | ServiceError:
            """A new session for the options, reserved on the least-loaded worker."""
            error = check_env(self.env_specs, options.env)
            try:
                reasoning = ReasoningConfig.model_validate(options.reasoning)
            except ValidationError as exc:
                error = error or ServiceError.from_validation(exc, "reasoning")
            else:
                error = error or self.rewards.check_judge(reasoning)
            if error is None and self.draining:
                error = ServiceError(
                    "UNAVAILABLE", "the server is draining: it takes no new sessions"
                )
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

        def applied(options: SessionOptions, session: Session, reply: SessionReply) -> None:
            session.last_reply = reply
            self._counter(self.metrics.resets, session.env).inc()

        def otherwise(options: SessionOptions, session: Session, answer: Any) -> Any:
            self.sessions.forget(session)  # the worker made none
            return answer

        call = _Call(
            SessionOptions,
            lambda options, session: Create(session.id, session.options, session.reasoning),
            applied,
            find=find,
            otherwise=otherwise,
        )
        return await self._per_session(items, call)

    async def reset(
        self, items: Sequence[ResetItem | Mapping[str, Any]]
    ) -> list[SessionReply | ServiceError]:
        def applied(item: ResetItem, session: Session, reply: SessionReply) -> None:
            session.step_index = 0
            session.last_reply = reply
            session.last_step = None
            self._counter(self.metrics.resets, session.env).inc()

        call = _Call(
            ResetItem,
            lambda item, session: Reset(session.id, item.seed, item.image_encoding),
            applied,
        )
        return await self._per_session(items, call)

    async def step(
        self, items: Sequence[StepItem | Mapping[str, Any]]
    ) -> list[SessionReply | ServiceError]:
        started = time.perf_counter()

        most = self.settings.max_actions_per_step

        def admit(item: StepItem, session: Session) -> SessionReply | ServiceError | None:
            if item.actions is not None and len(item.actions) > most:
                return ServiceError(
                    "INVALID_ARGUMENT",
                    f"actions: {len(item.actions)} actions in one step, over this server's "
                    f"limit of {most} (max_actions_per_step, GET /v1/limits)",
                    "actions",
                )
            if item.actions is not None and (error := self._arg_error(session.env, item.actions)):
                return error
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

        def applied(item: StepItem, session: Session, reply: SessionReply) -> None:
            session.step_index += 1
            session.last_reply = reply
            session.last_step = step_key(item)
            self._counter(self.metrics.steps, session.env).inc()

        call = _Call(
            StepItem,
            lambda item, session: Step(
                session.id, item.response, item.actions, item.image_encoding
            ),
            applied,
            admit=admit,
            post=self.rewards.grade,
        )
        results = await self._per_session(items, call)
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
        """A close forgets the session at once (a later call on it, or its id again in
        this batch, gets NOT_FOUND: closed), then the worker closes its environment after
        any call in flight on it."""
        return await self._close(session_ids, "was closed")

    async def _close(self, session_ids: Sequence[str], why: str) -> list[ServiceError | None]:
        """`close`, a later call on a session answering "session <id> <why>"."""

        def find(session_id: str) -> Session | ServiceError:
            session = self.sessions.lookup(session_id)
            if isinstance(session, Session):
                closed = ServiceError("NOT_FOUND", f"session {session_id} {why}", "session_id")
                self.sessions.forget(session, closed)
            return session

        def otherwise(session_id: str, session: Session, answer: Any) -> Any:
            # SESSION_LOST: the environment went with its worker, closed all the same
            lost = isinstance(answer, ServiceError) and answer.code == "SESSION_LOST"
            return None if lost else answer

        call = _Call(
            str,
            lambda _, session: Close(session.id),
            None,
            find=find,
            otherwise=otherwise,
            closes=True,
        )
        return await self._per_session(session_ids, call)

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
        forks: dict[str, list[Session]] = {}  # by source id: the sessions reserved for it

        def admit(item: ForkItem, source: Session) -> ServiceError | None:
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
            forks[source.id] = [
                self.sessions.reserve(
                    source.worker,
                    source.options,
                    source.reasoning,
                    step_index=source.step_index,
                    last_step=source.last_step,
                )
                for _ in range(item.n)
            ]
            return None

        def message(item: ForkItem, source: Session) -> Fork:
            return Fork(source.id, tuple(f.id for f in forks[source.id]))

        def otherwise(item: ForkItem, source: Session, answer: Any) -> Any:
            if isinstance(answer, ServiceError):
                for fork in forks[source.id]:
                    self.sessions.forget(fork)
                return answer
            return [self._forked(source, fork, answer) for fork in forks[source.id]]

        call = _Call(
            ForkItem,
            message,
            None,
            admit=admit,
            otherwise=otherwise,
            held=forks,
            twice="appears twice in one fork batch; ask for n forks once",
        )
        return await self._per_session(items, call)

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
            "draining": self.draining,
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
    async def _per_session(self, items: Sequence[Any], call: _Call) -> list:
        """The one path of every call on sessions (create, reset, step, close, fork):
        validate each item and find its session; wait for the calls in flight on those
        sessions (calls on one session are serialised), then mark them busy; send one
        message per worker with its items and record the answers (`_Call` says what each
        kind of call does at each point)."""
        self._check_batch(items, "items" if call.model is not str else "session_ids")
        await self.wait_started()
        results: list[Any] = [None] * len(items)
        targets: list[tuple[int, Any, Session]] = []
        seen: set[str] = set()
        for pos, raw in enumerate(items):
            item = raw if call.model is str else validate(call.model, raw)
            session = item if isinstance(item, ServiceError) else call.find(item)
            if session is None:
                session = self.sessions.lookup(item.session_id)
            if isinstance(session, ServiceError):
                results[pos] = session
            elif session.id in seen:
                results[pos] = ServiceError(
                    "INVALID_ARGUMENT",
                    f"session {session.id} {call.twice}",
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
            if self.sessions.get(session.id) is not session and not call.closes:
                results[pos] = self.sessions.lookup(session.id)  # closed or lost meanwhile
                continue
            session.last_used = time.monotonic()
            early = call.admit(item, session) if call.admit is not None else None
            if early is not None:
                results[pos] = early
                continue
            for held in (session, *call.held.get(session.id, ())):
                held.busy = loop.create_future()
            planned.setdefault(session.worker, []).append((pos, item, session))

        async def finish(part: list[tuple[int, Any, Session]], answers: list) -> None:
            if call.post is not None:
                answers = await call.post(part, answers)
            for (pos, item, session), answer in zip(part, answers, strict=True):
                if call.applied is not None and isinstance(answer, SessionReply):
                    stored, results[pos] = writable(answer)
                    call.applied(item, session, stored)
                elif call.otherwise is not None:
                    results[pos] = call.otherwise(item, session, answer)
                else:
                    results[pos] = self._failed(session, answer)

        async def run(worker: WorkerHandle, group: list[tuple[int, Any, Session]]) -> None:
            # each piece of the worker's answers is finished as it comes, while the worker
            # goes on with the next one (`WorkerPool.pieces`)
            finishing = []
            try:
                messages = [call.message(i, s) for _, i, s in group]
                envs = [s.env for _, _, s in group]
                try:
                    async for start, answers in self.pool.pieces(worker, messages, envs):
                        part = group[start : start + len(answers)]
                        if start + len(answers) == len(group):  # the last (or only) piece
                            await finish(part, answers)
                        else:
                            finishing.append(asyncio.ensure_future(finish(part, answers)))
                finally:  # every answer recorded before its session is released
                    if finishing:
                        await asyncio.gather(*finishing)
            finally:
                for _, _, session in group:
                    for held in (session, *call.held.get(session.id, ())):
                        self.sessions.release(held)

        # shielded: a caller that gives up (client gone) must not leave a call applied in
        # the worker but unrecorded here (a step_index would drift, a session be unknown);
        # the adapters rely on this and add no shield of their own
        if len(planned) == 1:  # one worker (most calls): no gather around its one task
            ((worker, group),) = planned.items()
            await asyncio.shield(run(worker, group))
        elif planned:
            await asyncio.shield(asyncio.gather(*(run(w, g) for w, g in planned.items())))
        self.metrics.sessions.set(len(self.sessions))
        return self._count_errors(results)

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

    def _arg_error(self, env: str, actions: Sequence[Any]) -> ServiceError | None:
        """INVALID_ARGUMENT for an explicit action given numbers its action takes none of
        (a discrete name, e.g. Left); a call action's count is the environment's to judge."""
        space = self.env_specs[env].action_space or {}
        takes = {name.lower(): n for name, n in space.get("arity", {}).items()}
        for pos, action in enumerate(actions):
            if action.args and not takes.get(action.name.strip().lower()):
                return ServiceError(
                    "INVALID_ARGUMENT",
                    f"actions.{pos}.args: action {action.name!r} takes no arguments, "
                    f"{len(action.args)} given",
                    f"actions.{pos}.args",
                )
        return None

    def _counter(self, metric: Any, label: str) -> Any:
        """`metric.labels(label)`, looked up once (prometheus checks the labels per call:
        1 us, for every step of a batch)."""
        key = (metric, label)
        child = self._children.get(key)
        if child is None:
            child = self._children[key] = metric.labels(label)
        return child

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
