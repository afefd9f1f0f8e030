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

How it works: environments live in worker processes (`worker.py`), sessions are
pinned to the least-loaded worker at creation, and this (API) process only routes:
one batch call sends ONE message per worker holding all its items (the typed messages
of `messages.py`) and awaits the workers concurrently. A step's reward is assembled
here, in `assemble_reward`, from what the worker measured (the environment's reward,
the rule-based reasoning score), the LLM judge's scores when the session has one, and
the reasoning guard's penalty (both of which live in this process). A worker that dies takes only its own sessions (they answer
SESSION_LOST, also for calls in flight) and is replaced. Sessions have server-made
ids (naming this server: session_ids.py), an idle timeout (a reaper task), a cap (CAPACITY), and a
`step_index` retry cache: a step repeated with the previous index is answered from
memory, never applied twice; concurrent calls on one session are serialised.
"""

from __future__ import annotations

import asyncio
import collections
import dataclasses
import functools
import gc
import itertools
import json
import logging
import math
import multiprocessing
import os
import pickle
import socket
import struct
import time
from collections.abc import Iterable, Iterator, Mapping, Sequence, Sized
from dataclasses import dataclass, field
from typing import Any, TypeVar

from pydantic import BaseModel, ValidationError

from env_server.reasoning import Judge, ReasoningConfig, ResponseGuard, TurnScore

from .messages import (
    Close,
    Create,
    Fork,
    Forked,
    Frame,
    ListEnv,
    Message,
    Ready,
    Reset,
    Step,
    Stepped,
    Stop,
    Warmed,
)
from .metrics import Metrics
from .models import (
    MAX_FORKS,
    SEED_LIMIT,
    EnvSpec,
    ForkItem,
    ResetItem,
    RewardParts,
    ServiceError,
    SessionOptions,
    SessionReply,
    StepItem,
)
from .protocol import check_batch, check_env, unknown_session
from .session_ids import Origin
from .settings import Settings
from .worker import worker_main

M = TypeVar("M", bound=BaseModel)
log = logging.getLogger("visenv.service")


class WorkerLost(Exception):
    """The worker process died (before or while answering)."""


@dataclass
class _Queued:
    """A request waiting to be sent to a worker (coalesced with others into one message)."""

    batch: list[Message]
    future: asyncio.Future
    deadline: float  # seconds the worker may take for it (see WorkerHandle.stuck)


class WorkerHandle:
    """The API process's end of one worker process: a framed, pickled message pipe
    (the worker protocol of `messages.py`).

    The framing is multiprocessing.Connection's (a 4-byte big-endian length, then the
    bytes), so the worker uses a plain Connection while this side stays non-blocking.
    """

    CONCURRENT = 4  # requests finding the worker busy ...
    CONCURRENT_SPAN = 0.5  # ... within this many seconds: concurrent traffic (coalesce_window)
    PREWARM_ALLOWANCE = 180.0  # seconds one environment's pre-warm may take (see `stuck`)

    def __init__(
        self,
        index: int,
        ctx: multiprocessing.context.BaseContext,
        env_paths: dict[str, str] | None = None,
        *,
        coalesce_window: float = 0.0,
        coalesce_max_items: int = 512,
        prewarm: Sequence[str] = (),
        preload: Sequence[str] = (),
    ) -> None:
        self.index = index
        self.preload = list(preload)  # envs whose modules the worker imports at start
        self.env_paths = dict(env_paths or {})
        self.prewarm = list(prewarm)  # envs the worker warms up after it says Ready
        self.warmed: dict[str, float | str] = {}  # ... and how long each took (or why not)
        self.warming: set[str] = set(self.prewarm)  # ... and those not warmed yet
        # coalescing (see `request`): requests queued while a message is in flight
        self.coalesce_window = coalesce_window
        self.coalesce_max_items = coalesce_max_items
        self._queue: collections.deque[_Queued] = collections.deque()
        self._queued_items = 0
        self._in_flight = 0  # messages sent and not yet answered
        self._timer: asyncio.TimerHandle | None = None
        self._flush_soon = False
        # when the last requests that found the worker busy arrived (concurrency evidence)
        self._overlaps: collections.deque[float] = collections.deque(maxlen=self.CONCURRENT)
        # the deadline of each message in flight, oldest first, and when the worker began
        # the oldest (its last answer, or the send if it was idle): see `stuck`
        self._deadlines: collections.deque[float] = collections.deque()
        self._progress_at = 0.0
        self.messages_sent = 0  # pipe messages, and the requests they carried
        self.requests_sent = 0
        self.ctx = ctx
        self.sessions: set[str] = set()
        self.pid: int | None = None
        self.alive = False
        self.process: multiprocessing.process.BaseProcess | None = None
        self._pending: dict[int, asyncio.Future] = {}
        self._ids = itertools.count(1)
        self._reader: asyncio.StreamReader | None = None
        self._writer: asyncio.StreamWriter | None = None
        self._read_task: asyncio.Task | None = None
        self._stopping = False
        self.killed = False
        self.on_death: Any = None  # callable(WorkerHandle), set by the service

    async def start(self, timeout: float = 60.0) -> None:
        parent, child = self.ctx.Pipe(duplex=True)
        self.process = self.ctx.Process(
            target=worker_main,
            args=(child, self.index, self.env_paths, self.prewarm, self.preload),
            name=f"visenv-worker-{self.index}",
            daemon=True,
        )
        await asyncio.to_thread(self.process.start)
        child.close()  # so that the worker's death closes the pipe (EOF here)
        sock = socket.socket(fileno=os.dup(parent.fileno()))
        parent.close()
        self._reader, self._writer = await asyncio.open_unix_connection(sock=sock)
        try:
            _, ready = pickle.loads(await asyncio.wait_for(self._read(), timeout))
        except (asyncio.IncompleteReadError, ConnectionError, TimeoutError) as exc:
            self.process.kill()
            raise RuntimeError(f"worker {self.index} failed to start: {exc!r}") from exc
        assert isinstance(ready, Ready)
        self.pid = ready.pid
        self.alive = True
        self._read_task = asyncio.create_task(self._read_loop(), name=f"worker-{self.index}-read")

    async def _read(self) -> bytes:
        assert self._reader is not None
        (size,) = struct.unpack("!i", await self._reader.readexactly(4))
        if size == -1:
            (size,) = struct.unpack("!Q", await self._reader.readexactly(8))
        return await self._reader.readexactly(size)

    async def _read_loop(self) -> None:
        try:
            while True:
                request_id, result = pickle.loads(await self._read())
                if isinstance(result, Warmed):  # a notice: one env pre-warmed
                    self.warmed[result.name] = result.took
                    self.warming.discard(result.name)
                    self._progress_at = asyncio.get_running_loop().time()  # progress too
                    continue
                future = self._pending.pop(request_id, None)
                if future is not None and not future.done():
                    future.set_result(result)
        except (asyncio.IncompleteReadError, ConnectionError, OSError, EOFError):
            pass  # the worker died or was stopped
        finally:
            self._died()

    def _died(self) -> None:
        if not self.alive:
            return
        self.alive = False
        for future in self._pending.values():
            if not future.done():
                future.set_exception(WorkerLost(f"worker {self.index} (pid {self.pid}) died"))
        self._pending.clear()
        if self._writer is not None:
            self._writer.close()
        if self.process is not None:
            self.process.join(timeout=0)  # reap the zombie if it is already gone
        if not self._stopping and self.on_death is not None:
            self.on_death(self)

    async def request(
        self, batch: list[Message], deadline: float = 60.0
    ) -> list[Any] | ServiceError:
        """Send a batch of messages to the worker and await their answers (a list, in
        order; or one ServiceError when the worker could not read the message), coalesced
        with concurrent batches.

        Requests made while the worker has a message in flight wait in a queue, and the
        moment it answers, everything queued goes as ONE message (the batches concatenated,
        at most `coalesce_max_items` items; a longer queue goes without waiting). A request
        on an idle worker is sent at the end of the current turn of the event loop (with any
        others that turn brought): microseconds, no added latency. Under concurrent traffic,
        detected as requests that keep finding the worker busy (CONCURRENT of them within
        CONCURRENT_SPAN s), a request on an idle worker waits up to `coalesce_window` s for
        company instead, so 64 clients each stepping their own session cost a few messages a
        round, not 64. A lone client, or one sending batches, never overlaps itself, so it
        never waits. Sub-requests keep their order (a session's step, then its close, stay
        in that order); each caller gets its own answer, or WorkerLost if the worker dies.
        """
        if not self.alive or self._writer is None:
            raise WorkerLost(f"worker {self.index} is not running")
        if not batch:
            return []
        loop = asyncio.get_running_loop()
        if self._in_flight or self._queue:
            self._overlaps.append(loop.time())
        future = loop.create_future()
        self._queue.append(_Queued(batch, future, deadline))
        self._queued_items += len(batch)
        if self._queued_items >= self.coalesce_max_items:
            self._flush()
        elif self._in_flight or self._timer is not None:
            pass  # sent when the message in flight answers, or the window closes
        elif self.coalesce_window > 0 and self.concurrent(loop.time()):
            self._timer = loop.call_later(self.coalesce_window, self._window_over)
        elif not self._flush_soon:
            self._flush_soon = True
            loop.call_soon(self._flush_now)
        return await future

    def stuck(self, now: float) -> bool:
        """Whether the worker has spent longer than its deadline on one message: the clock
        runs from its last answer (or from the send, if it was idle), so a worker answering
        message after message of a long batch is busy, never stuck."""
        if not self._deadlines:
            return False
        # while it pre-warms an environment (a simulator's start-up: a minute), a message
        # waits behind that: allowed on top of the deadline
        allowance = self.PREWARM_ALLOWANCE if self.warming else 0.0
        return now - self._progress_at > self._deadlines[0] + allowance

    def concurrent(self, now: float) -> bool:
        """Whether concurrent callers are using this worker now (see `request`)."""
        return (
            len(self._overlaps) == self.CONCURRENT
            and now - self._overlaps[0] < self.CONCURRENT_SPAN
        )

    def _flush_now(self) -> None:
        self._flush_soon = False
        self._flush()

    def _window_over(self) -> None:
        self._timer = None
        self._flush(force=True)

    def _flush(self, force: bool = False) -> None:
        """Send the queue (in messages of at most coalesce_max_items items) while the worker
        has nothing in flight, or the queue is full, or `force` (the window is over)."""
        if not self.alive or self._writer is None:
            lost = WorkerLost(f"worker {self.index} (pid {self.pid}) is not running")
            while self._queue:
                entry = self._queue.popleft()
                if not entry.future.done():
                    entry.future.set_exception(lost)
            self._queued_items = 0
            return
        while self._queue and (
            force or self._in_flight == 0 or self._queued_items >= self.coalesce_max_items
        ):
            force = False
            entries: list[_Queued] = []
            items = 0
            while self._queue and (
                not entries or items + len(self._queue[0].batch) <= self.coalesce_max_items
            ):
                entry = self._queue.popleft()
                self._queued_items -= len(entry.batch)
                if not entry.future.done():  # its caller gave up: not sent
                    entries.append(entry)
                    items += len(entry.batch)
            if entries:
                self._send(entries)
        if not self._queue and self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def _send(self, entries: list[_Queued]) -> None:
        request_id = next(self._ids)
        message = asyncio.get_running_loop().create_future()
        self._pending[request_id] = message
        self._in_flight += 1
        self.messages_sent += 1
        self.requests_sent += len(entries)
        message.add_done_callback(functools.partial(self._answered, entries))
        if not self._deadlines:
            self._progress_at = asyncio.get_running_loop().time()
        self._deadlines.append(max(e.deadline for e in entries))
        try:
            if len(entries) == 1:
                batch = entries[0].batch
            else:  # coalesced: one batch, answered in order and split back in _answered
                batch = [message for entry in entries for message in entry.batch]
            data = pickle.dumps((request_id, batch), protocol=pickle.HIGHEST_PROTOCOL)
            assert self._writer is not None
            self._writer.write(struct.pack("!i", len(data)) + data)
        except (ConnectionError, OSError) as exc:
            self._pending.pop(request_id, None)
            message.set_exception(WorkerLost(f"worker {self.index} (pid {self.pid}) died: {exc}"))
        except Exception as exc:  # e.g. a payload that can't be pickled: a bug in the service
            self._pending.pop(request_id, None)
            message.set_exception(exc)

    def _answered(self, entries: list[_Queued], message: asyncio.Future) -> None:
        """Hand each caller its part of a message's answer, then send what queued meanwhile."""
        self._in_flight -= 1
        if self._deadlines:
            self._deadlines.popleft()
        self._progress_at = asyncio.get_running_loop().time()
        if message.cancelled():
            error: BaseException | None = WorkerLost(f"worker {self.index}: message cancelled")
        else:
            error = message.exception()
        if error is None:
            result = message.result()
            if len(entries) == 1 or not isinstance(result, list):
                # (not a list: the worker could not read the message; every caller gets it)
                answers = [result] * len(entries)
            else:  # coalesced: each caller's part, in order
                ends = itertools.accumulate(len(e.batch) for e in entries)
                answers = [
                    result[end - len(e.batch) : end] for e, end in zip(entries, ends, strict=True)
                ]
            for entry, answer in zip(entries, answers, strict=True):
                if not entry.future.done():
                    entry.future.set_result(answer)
        else:
            for entry in entries:
                if not entry.future.done():
                    entry.future.set_exception(error)
        self._flush()

    def kill(self) -> bool:
        """SIGKILL the process (a stuck worker): its pipe closes, calls in flight fail with
        WorkerLost and `on_death` replaces it, as for any death. False if it was killed
        already (several callers may find it stuck)."""
        if self.killed or self.process is None or not self.process.is_alive():
            return False
        self.killed = True
        self.process.kill()
        return True

    async def stop(self, timeout: float = 5.0) -> None:
        self._stopping = True
        if self.alive and self._writer is not None:
            try:
                data = pickle.dumps((0, Stop()))
                self._writer.write(struct.pack("!i", len(data)) + data)
                await self._writer.drain()
            except (ConnectionError, OSError):
                pass
        if self.process is not None:
            await asyncio.to_thread(self.process.join, timeout)
            if self.process.is_alive():
                self.process.kill()
                await asyncio.to_thread(self.process.join, timeout)
        if self._read_task is not None:
            self._read_task.cancel()
            await asyncio.gather(self._read_task, return_exceptions=True)
        self._died()


@dataclass
class Session:
    id: str
    env: str
    worker: WorkerHandle
    options: SessionOptions
    reasoning: ReasoningConfig
    step_index: int = 0
    last_reply: SessionReply | None = None
    last_used: float = field(default_factory=time.monotonic)
    busy: asyncio.Future | None = None  # set while a call on this session is in flight
    # the guard its responses are counted in: its config's (shared by every session of that
    # config) or, for a fork, its own copy; None until first needed
    guard: ResponseGuard | None = None
    # the body of the last step applied (`_step_key`): a retry must resend the same
    last_step: tuple | None = None


def _step_key(item: StepItem) -> tuple:
    """What makes two step bodies the same request (a retry), step_index aside."""
    actions = None
    if item.actions is not None:
        actions = tuple((a.name, tuple(a.args), a.payload) for a in item.actions)
    return item.response, actions, item.image_encoding


def _validate(model: type[M], raw: M | Mapping[str, Any] | ServiceError) -> M | ServiceError:
    if isinstance(raw, model | ServiceError):  # parsed by the adapter (or refused there)
        return raw
    try:
        return model.model_validate(raw)
    except ValidationError as exc:
        return ServiceError.from_validation(exc)


def _nonfinite(value: Any, where: str) -> Iterator[str]:
    """Where the non-finite numbers in a JSON-like value sit."""
    if isinstance(value, float):
        if not math.isfinite(value):
            yield where
    elif isinstance(value, dict):
        for key, item in value.items():
            yield from _nonfinite(item, f"{where}.{key}")
    elif isinstance(value, list):
        for n, item in enumerate(value):
            yield from _nonfinite(item, f"{where}.{n}")


def _unless_text(holder: Any, name: str, where: str) -> Iterator[str]:
    if holder.json_text(name) is None:
        yield from _nonfinite(getattr(holder, name), where)


def writable(reply: SessionReply) -> tuple[SessionReply, SessionReply | ServiceError]:
    """(what the session keeps, what the caller gets) for a reply from a worker.

    A reply whose numbers are all finite is both. One with a NaN or an infinity (an
    environment's bug: requests carry none) can't be written as JSON: the caller gets
    INTERNAL with an error id (the log has the places), and the session keeps a copy with
    those numbers as null (a reward part: 0, the places listed in info.unwritable), so
    that it stays readable (GET, a retry, a fork) and can go on."""
    # (a part that came as JSON text, `wire.JSONText`, has none: the worker wrote it so)
    obs = reply.observation
    bad = [
        *_nonfinite(reply.reward, "reward"),
        *_nonfinite(reply.reward_parts.to_json(), "reward_parts"),
        *_unless_text(obs, "ground_truth", "observation.ground_truth"),
        *_unless_text(obs, "info", "observation.info"),
        *_unless_text(reply, "info", "info"),
    ]
    if not bad:
        return reply, reply
    error = ServiceError.internal(
        ValueError(f"non-finite numbers at {', '.join(bad)}"),
        f"the reply of {reply.session_id}",
        log,
    )

    def scrub(value: Any) -> Any:
        return json.loads(json.dumps(value), parse_constant=lambda _: None)

    parts = RewardParts(
        **{k: v if math.isfinite(v) else 0.0 for k, v in reply.reward_parts.to_json().items()}
    )
    observation = dataclasses.replace(
        reply.observation,
        ground_truth=scrub(reply.observation.ground_truth),
        info=scrub(reply.observation.info),
    )
    stored = dataclasses.replace(
        reply,
        observation=observation,
        reward_parts=parts,
        reward=parts.total,
        info={**scrub(reply.info), "unwritable": {"error_id": error.error_id, "fields": bad}},
    )
    return stored, error


def assemble_reward(
    stepped: Stepped, score: TurnScore | None, cfg: ReasoningConfig, penalty: float = 0.0
) -> SessionReply:
    """The one place a step's reward is assembled: its parts, their sum and the score keys
    of its info, from the environment's reward (`stepped.env_reward`), the turn's
    reasoning score (the worker's rule-based one, or the LLM judge's; None for manual
    play) and the guard's `penalty`. Returns `stepped.reply`, filled in.

    Parts: env; format (the format reward earned); observation and prediction
    (beta_s * observation_score and beta_w * prediction_score, when the turn earned a
    world-model reward); penalty (-penalty). reward = their sum.
    """
    reply = stepped.reply
    parts = RewardParts(env=stepped.env_reward)
    if score is not None:
        parts.format = float(score.format)
        if score.world_model:
            parts.observation = float(cfg.beta_s * (score.observation_score or 0.0))
            parts.prediction = float(cfg.beta_w * (score.prediction_score or 0.0))
    if penalty:
        parts.penalty = -penalty
    reply.reward_parts = parts
    reply.reward = parts.total
    scores = {
        "observation_score": None if score is None else score.observation_score,
        "prediction_score": None if score is None else score.prediction_score,
        "judge_error": None if score is None else score.judge_error,
    }
    text = reply.json_text("info")  # the worker's info as JSON text, without SCORE_KEYS
    if text is not None and _finite(scores):  # the scores put in front of it as text
        first = json.dumps(scores)
        reply.set_json_text("info", first if text == "{}" else f"{first[:-1]}, {text[1:]}")
    else:
        reply.info = {**scores, **reply.info}
    return reply


def _finite(scores: dict[str, Any]) -> bool:
    return not any(isinstance(v, float) and not math.isfinite(v) for v in scores.values())


class EnvService:
    """Sessions over worker processes; see the module docstring for the API."""

    def __init__(self, settings: Settings | None = None) -> None:
        self.settings = settings or Settings()
        self.metrics = Metrics()
        self.origin = Origin.here(self.settings.node_id)  # named in every session id
        self.sessions: dict[str, Session] = {}
        self.workers: list[WorkerHandle] = []
        self.env_specs: dict[str, EnvSpec] = {}
        self.worker_restarts = 0
        # ids of sessions that are gone, with the error a later call on them gets
        self._gone: collections.OrderedDict[str, ServiceError] = collections.OrderedDict()
        self._ctx = multiprocessing.get_context(self.settings.start_method)
        self._restarts: set[asyncio.Task] = set()
        self._reaper: asyncio.Task | None = None
        self._started_at = time.monotonic()
        self._stopping = False
        self._judges: dict[str, Judge] = {}  # one per distinct judge config
        self._guards: dict[str, ResponseGuard] = {}  # one per distinct guard config
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
        if self.settings.start_method == "forkserver":
            self._ctx.set_forkserver_preload(["env_server.service.worker"])
        self.workers = [self._worker_handle(i) for i in range(self.settings.workers)]
        for handle in self.workers:
            handle.on_death = self._on_worker_death
        await asyncio.gather(*(w.start() for w in self.workers))
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

    def _worker_handle(self, index: int) -> WorkerHandle:
        return WorkerHandle(
            index,
            self._ctx,
            self.settings.env_paths,
            coalesce_window=self.settings.coalesce_window,
            coalesce_max_items=self.settings.coalesce_max_items,
            prewarm=[e for e in self.settings.prewarm or () if e in (self.settings.envs or [e])],
            preload=self.settings.envs or [],
        )

    async def stop(self) -> None:
        self._stopping = True
        if self._reaper is not None:
            self._reaper.cancel()
        for task in list(self._restarts):
            task.cancel()
        await asyncio.gather(*(w.stop() for w in self.workers), return_exceptions=True)
        await asyncio.gather(*(j.aclose() for j in self._judges.values()), return_exceptions=True)
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
            "items_per_worker_message": self.piece_items(),
            "seed": {"type": "integer", "minimum": 0, "maximum": SEED_LIMIT - 1},
        }

    def _check_batch(self, items: Sized, field: str = "items") -> None:
        """Refuse a call of more items than `max_batch_items`, at once, naming the limit."""
        try:
            check_batch(items, self.settings.max_batch_items, field)
        except ServiceError as error:
            self.metrics.errors.labels(error.code).inc()
            raise

    def _check_judge(self, reasoning: ReasoningConfig) -> ServiceError | None:
        """A judge endpoint must be one the operator allowed: the server sends requests
        (with an API key from its own environment) to it, so a client must not be able to
        point it anywhere (server-side request forgery, key leaks)."""
        judge = reasoning.judge
        if judge is None:
            return None
        allowed = self.settings.judge_urls or []
        if not any(judge.base_url.rstrip("/").startswith(u.rstrip("/")) for u in allowed):
            return ServiceError(
                "INVALID_ARGUMENT",
                f"reasoning.judge.base_url {judge.base_url!r} is not an allowed judge endpoint; "
                "the server operator lists those in VISENV_JUDGE_URLS "
                f"(now: {', '.join(allowed) or 'none'})",
                "reasoning.judge.base_url",
            )
        if judge.api_key_env.startswith("VISENV_"):
            return ServiceError(
                "INVALID_ARGUMENT",
                "reasoning.judge.api_key_env may not name the server's own VISENV_* settings",
                "reasoning.judge.api_key_env",
            )
        return None

    async def create(
        self, items: Sequence[SessionOptions | Mapping[str, Any]]
    ) -> list[SessionReply | ServiceError]:
        self._check_batch(items)
        await self.wait_started()
        results: list[Any] = [None] * len(items)
        planned: dict[WorkerHandle, list[tuple[int, Session]]] = {}
        for pos, raw in enumerate(items):
            options = _validate(SessionOptions, raw)
            if isinstance(options, ServiceError):
                results[pos] = options
                continue
            error = check_env(self.env_specs, options.env)
            try:
                reasoning = ReasoningConfig.model_validate(options.reasoning)
            except ValidationError as exc:
                error = error or ServiceError.from_validation(exc, "reasoning")
            else:
                error = error or self._check_judge(reasoning)
            if error is None and len(self.sessions) >= self.settings.max_sessions:
                error = ServiceError(
                    "CAPACITY",
                    f"the server holds its maximum of {self.settings.max_sessions} sessions; "
                    "close some or retry later",
                )
            worker = self._pick_worker() if error is None else None
            if error is None and worker is None:
                error = ServiceError("UNAVAILABLE", "no worker process is running; retry shortly")
            if error is not None:
                results[pos] = error
                continue
            session = Session(
                id=self.origin.new_id(),
                env=options.env,
                worker=worker,
                options=options,
                reasoning=reasoning,
            )
            session.busy = asyncio.get_running_loop().create_future()
            self.sessions[session.id] = session  # reserved: counts towards the cap
            worker.sessions.add(session.id)
            planned.setdefault(worker, []).append((pos, session))

        async def run(worker: WorkerHandle, group: list[tuple[int, Session]]) -> None:
            batch = [Create(s.id, s.options, s.reasoning) for _, s in group]
            answers = await self._call(worker, batch, [s.env for _, s in group])
            for (pos, session), answer in zip(group, answers, strict=True):
                results[pos] = answer
                if isinstance(answer, SessionReply):
                    session.last_reply, results[pos] = writable(answer)
                    self.metrics.resets.labels(session.env).inc()
                else:
                    self._forget(session)
                self._release(session)

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
                if session.last_step is not None and _step_key(item) != session.last_step:
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
            session.last_step = _step_key(item)
            self.metrics.steps.labels(session.env).inc()

        results = await self._session_call(StepItem, items, message, applied, precheck, self._grade)
        self.metrics.step_seconds.observe(time.perf_counter() - started)
        return results

    async def get(self, session_ids: Sequence[str]) -> list[SessionReply | ServiceError]:
        await self.wait_started()
        self._check_batch(session_ids, "session_ids")
        results: list[SessionReply | ServiceError] = []
        for session_id in session_ids:
            session = self._lookup(session_id)
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
            session = self._lookup(session_id)
            if isinstance(session, ServiceError):
                results[pos] = session
                continue
            closed = ServiceError("NOT_FOUND", f"session {session_id} was closed", "session_id")
            self._forget(session, closed)
            planned.setdefault(session.worker, []).append((pos, session))

        async def run(worker: WorkerHandle, group: list[tuple[int, Session]]) -> None:
            batch, envs = [Close(s.id) for _, s in group], [s.env for _, s in group]
            answers = await self._call(worker, batch, envs)
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
            item = _validate(ForkItem, raw)
            if isinstance(item, ServiceError):
                results[pos] = item
                continue
            source = self._lookup(item.session_id)
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
                results[pos] = self._lookup(source.id)
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
                fork = Session(
                    id=self.origin.new_id(),
                    env=source.env,
                    worker=source.worker,
                    options=source.options,
                    reasoning=source.reasoning,
                    step_index=source.step_index,
                    last_step=source.last_step,
                    busy=loop.create_future(),
                )
                self.sessions[fork.id] = fork  # reserved: counts towards the cap
                source.worker.sessions.add(fork.id)
                forks.append(fork)
            planned.setdefault(source.worker, []).append((pos, source, forks))

        async def run(worker: WorkerHandle, group: list[tuple[int, Session, list[Session]]]):
            try:
                batch = [Fork(source.id, tuple(f.id for f in forks)) for _, source, forks in group]
                envs = [source.env for _, source, _ in group]
                answers = await self._call(worker, batch, envs)
                for (pos, source, forks), answer in zip(group, answers, strict=True):
                    if isinstance(answer, ServiceError):
                        results[pos] = answer
                        for fork in forks:
                            self._forget(fork)
                        continue
                    results[pos] = [self._forked(source, fork, answer) for fork in forks]
            finally:
                for _, source, forks in group:
                    for session in (source, *forks):
                        self._release(session)

        # shielded: sessions the worker made must be recorded here even if the caller leaves
        await asyncio.shield(asyncio.gather(*(run(w, g) for w, g in planned.items())))
        self.metrics.sessions.set(len(self.sessions))
        return self._count_errors(results)

    def _forked(self, source: Session, fork: Session, answer: Forked) -> SessionReply:
        """Record a fork the worker made; its reply."""
        assert source.last_reply is not None
        if source.reasoning.guard.enabled:
            fork.guard = self._guard_of(source).copy()
        tolerance = answer.tolerance
        info = {
            **source.last_reply.info,
            "fork": {"source": source.id, "exact": tolerance is None, "tolerance": tolerance},
        }
        # also what a get() or a retry of the source's last step answers on the fork
        fork.last_reply = dataclasses.replace(source.last_reply, session_id=fork.id, info=info)
        return fork.last_reply

    def _guard_of(self, session: Session) -> ResponseGuard:
        """The session's reasoning guard: a fork's own copy, else the one of its config
        (looked up once, then remembered on the session)."""
        if session.guard is None:
            key = session.reasoning.guard.model_dump_json()
            guard = self._guards.get(key)
            if guard is None:
                guard = self._guards[key] = ResponseGuard(session.reasoning.guard)
            session.guard = guard
        return session.guard

    async def frame(self, session_id: str) -> bytes:
        await self.wait_started()
        session = self._lookup(session_id)
        if isinstance(session, ServiceError):
            raise session
        session.last_used = time.monotonic()
        answer = (await self._call(session.worker, [Frame(session.id)], [session.env]))[0]
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
            item = _validate(model, raw)
            if isinstance(item, ServiceError):
                results[pos] = item
                continue
            session = self._lookup(item.session_id)
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
                results[pos] = self._lookup(session.id)
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
                answers = await self._call(
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
                        self._forget(session, ServiceError(
                            "SESSION_LOST",
                            f"session {session.id} ended on internal error {answer.error_id}; "
                            "create a new session",
                        ))  # fmt: skip
                        self.metrics.sessions.set(len(self.sessions))
            finally:
                for _, _, session in group:
                    self._release(session)

        # shielded: a caller that gives up (client gone) must not leave a step applied in
        # the worker but unrecorded here (the step_index would drift)
        await asyncio.shield(asyncio.gather(*(run(w, g) for w, g in planned.items())))
        return self._count_errors(results)

    async def _grade(self, group: list[tuple[int, StepItem, Session]], answers: list) -> list:
        """Finish the steps a worker applied (`Stepped`): the LLM judge's scores when the
        session's grader is the judge, the guard's penalty, then the reward, assembled by
        `assemble_reward`."""
        scores = [a.score if isinstance(a, Stepped) else None for a in answers]
        by_judge: dict[str, list[int]] = {}
        for n, answer in enumerate(answers):
            if isinstance(answer, Stepped) and answer.judge is not None:
                key = answer.judge.cfg.judge.model_dump_json()
                if key not in self._judges:
                    self._judges[key] = Judge(answer.judge.cfg.judge)
                by_judge.setdefault(key, []).append(n)

        async def judge(key: str, todo: list[int]) -> None:
            judged = await self._judges[key].score_batch([answers[n].judge for n in todo])
            for n, score in zip(todo, judged, strict=True):
                scores[n] = score

        if by_judge:
            await asyncio.gather(*(judge(k, todo) for k, todo in by_judge.items()))
        for n, ((_, item, session), answer) in enumerate(zip(group, answers, strict=True)):
            if isinstance(answer, Stepped):
                penalty = self._penalty(item, session, scores[n])
                answers[n] = assemble_reward(answer, scores[n], session.reasoning, penalty)
        return answers

    def _penalty(self, item: StepItem, session: Session, score: TurnScore | None) -> float:
        """The reasoning guard's penalty (>= 0) on a step's response, judged by the mean of
        its world-model scores; 0 without a guard, a response or any score."""
        if score is None or item.response is None or not session.reasoning.guard.enabled:
            return 0.0
        graded = [s for s in (score.observation_score, score.prediction_score) if s is not None]
        if not graded:
            return 0.0  # nothing graded: nothing a policy could game
        return self._guard_of(session).penalty(item.response, sum(graded) / len(graded))

    async def _call(
        self, worker: WorkerHandle, batch: list[Message], envs: Iterable[str] = ()
    ) -> list:
        """A batch for one worker, sent in pieces of at most `piece_items` messages,
        one piece after another (other callers' requests go between them, so a big batch
        does not hold up other sessions, and each piece finishes well inside the deadline).
        If the worker dies, or spends longer than the deadline of the environments involved
        on one message (then it is killed and replaced), the items not yet answered answer
        SESSION_LOST."""
        envs = list(envs)
        deadline = self.deadline(envs)
        size = self.piece_items(envs)
        answers: list = []
        for start in range(0, len(batch), size):
            piece = batch[start : start + size]
            got = await self._call_piece(worker, piece, deadline)
            answers += got
            if got and isinstance(got[0], ServiceError) and got[0].code == "SESSION_LOST":
                return answers + [got[0]] * (len(batch) - len(answers))  # the worker is gone
        return answers

    async def _call_piece(self, worker: WorkerHandle, batch: list[Message], deadline: float):
        loop = asyncio.get_running_loop()
        request = asyncio.ensure_future(worker.request(batch, deadline))
        try:
            while True:
                done, _ = await asyncio.wait({request}, timeout=min(1.0, deadline / 10))
                if done:
                    answers = request.result()
                    break
                if worker.stuck(loop.time()):
                    op = type(batch[0]).__name__.lower()
                    self._kill_stuck(worker, op, deadline)
                    lost = ServiceError(
                        "SESSION_LOST",
                        f"the session's worker process did not answer {op} within "
                        f"{deadline:g} s (no answer to any message for that long: a stuck "
                        "environment?); it was killed and is being replaced: create a new "
                        "session",
                    )
                    return [lost] * len(batch)
        except WorkerLost as exc:
            lost = ServiceError("SESSION_LOST", f"the session's worker process died: {exc}")
            return [lost] * len(batch)
        finally:
            if not request.done():  # our caller gave up: the queued piece is not sent
                request.cancel()
        if isinstance(answers, ServiceError):  # the worker could not read the message
            return [answers] * len(batch)
        return answers

    def piece_items(self, envs: Iterable[str] = ()) -> int:
        """Items per message of a batch about `envs` (the smallest of theirs)."""
        pieces, most = self.settings.piece_items, self.settings.coalesce_max_items
        other = min(pieces.get("*", most), most)
        return min((min(pieces.get(e, other), most) for e in envs), default=other)

    def deadline(self, envs: Iterable[str] = ()) -> float:
        """Seconds a worker may take for one message about `envs` (the longest of theirs)."""
        own = self.settings.deadlines
        return max(
            (own.get(e, self.settings.deadline) for e in envs), default=self.settings.deadline
        )

    def _kill_stuck(self, worker: WorkerHandle, op: str, deadline: float) -> None:
        if not worker.kill():
            return
        log.error(
            "worker %d (pid %s) did not answer %s within %g s: killing it; its %d sessions are lost",
            worker.index, worker.pid, op, deadline, len(worker.sessions),
        )  # fmt: skip
        self.metrics.worker_timeouts.inc()

    def _pick_worker(self) -> WorkerHandle | None:
        alive = [w for w in self.workers if w.alive]
        return min(alive, key=lambda w: len(w.sessions)) if alive else None

    def _lookup(self, session_id: str) -> Session | ServiceError:
        session = self.sessions.get(session_id)
        if session is not None:
            return session
        gone = self._gone.get(session_id)
        if gone is not None:
            return gone
        return unknown_session(session_id)

    def _forget(self, session: Session, reason: ServiceError | None = None) -> None:
        if self.sessions.get(session.id) is session:
            del self.sessions[session.id]
        session.worker.sessions.discard(session.id)
        if reason is not None:
            self._remember(session.id, reason)

    def _remember(self, session_id: str, reason: ServiceError) -> None:
        """What a later call on a session that is gone answers; the `lost_memory` latest."""
        if self.settings.lost_memory <= 0:
            return
        self._gone[session_id] = reason
        self._gone.move_to_end(session_id)
        while len(self._gone) > self.settings.lost_memory:
            self._gone.popitem(last=False)

    @staticmethod
    def _release(session: Session) -> None:
        if session.busy is not None and not session.busy.done():
            session.busy.set_result(None)
        session.busy = None

    def _count_errors(self, results: Iterable[Any]) -> list:
        results = list(results)
        for result in results:
            if isinstance(result, ServiceError):
                self.metrics.errors.labels(result.code).inc()
        return results

    def _on_worker_death(self, handle: WorkerHandle) -> None:
        if self._stopping:
            return
        lost = ServiceError(
            "SESSION_LOST",
            f"the session's worker process (pid {handle.pid}) died; create a new session",
        )
        for session_id in list(handle.sessions):
            session = self.sessions.get(session_id)
            if session is not None:
                self._forget(session, lost)
        handle.sessions.clear()
        self.metrics.sessions.set(len(self.sessions))
        self.worker_restarts += 1
        self.metrics.worker_restarts.inc()
        replacement = self._worker_handle(handle.index)
        replacement.on_death = self._on_worker_death
        self.workers[handle.index] = replacement
        task = asyncio.get_running_loop().create_task(self._start_replacement(replacement))
        self._restarts.add(task)
        task.add_done_callback(self._restarts.discard)

    async def _start_replacement(self, handle: WorkerHandle) -> None:
        for attempt in range(5):
            try:
                await handle.start()
                return
            except RuntimeError:
                await asyncio.sleep(0.5 * (attempt + 1))

    async def _reap_loop(self) -> None:
        timeout = self.settings.idle_timeout
        interval = min(max(timeout / 4, 0.05), 30.0)
        while True:
            await asyncio.sleep(interval)
            await self.reap_idle(timeout)

    async def reap_idle(self, timeout: float) -> list[str]:
        """Close the sessions idle for longer than `timeout` seconds; their ids."""
        deadline = time.monotonic() - timeout
        idle = [s for s in self.sessions.values() if s.busy is None and s.last_used < deadline]
        if not idle:
            return []
        ids = [s.id for s in idle]
        limit = self.settings.max_batch_items
        for start in range(0, len(ids), limit):
            await self.close(ids[start : start + limit])
        for session_id in ids:
            self._remember(
                session_id,
                ServiceError(
                    "NOT_FOUND", f"session {session_id} was closed after {timeout:g} s idle"
                ),
            )
        self.metrics.reaped.inc(len(ids))
        return ids
