"""The worker pool, the API process's side: the handles, batching, restarts.

Environments live in worker processes (`worker.Worker` holds a process's sessions and
answers its messages; `worker_process.worker_main` is a process's entry point, the
worker's end of the pipe). This module is everything of the API process between it and
them:

- `WorkerHandle`, the API process's end of a worker's pipe (`pipe.py`), non-blocking;
- request batching (`WorkerHandle.request`): concurrent callers' batches coalesced into
  one message, flush windows;
- `WorkerPool`: the handles, the least-loaded pick, big batches sent in pieces, the
  per-environment deadlines, killing a stuck worker, and replacing a worker that died.
"""

from __future__ import annotations

import asyncio
import collections
import functools
import itertools
import logging
import multiprocessing
import os
import socket
from collections.abc import AsyncIterator, Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from .messages import Message, Ready, Stop, Warmed
from .metrics import Metrics
from .models import ServiceError
from .pipe import envelope, framed, opened, read_framed
from .settings import Settings
from .worker_process import worker_main

log = logging.getLogger("visenv.service")


class WorkerLost(Exception):
    """The worker process died (before or while answering)."""


class WorkerStuck(WorkerLost):
    """The worker was killed for spending longer than `deadline` s on one message."""

    def __init__(self, message: str, deadline: float) -> None:
        super().__init__(message)
        self.deadline = deadline


@dataclass
class _Queued:
    """A request waiting to be sent to a worker (coalesced with others into one message)."""

    batch: list[Message]
    future: asyncio.Future
    deadline: float  # seconds the worker may take for it (see WorkerHandle.stuck)
    ahead: bool = False  # the next piece of a batch: its own message, sent ahead (`request`)


class WorkerHandle:
    """The API process's end of one worker process's pipe (see the module docstring)."""

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
        # one timer per worker, armed while it has messages in flight (`_watch`)
        self._watchdog: asyncio.TimerHandle | None = None
        self.stuck_after: float | None = None  # killed as stuck: the deadline it overran
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
        self.on_death: Any = None  # callable(WorkerHandle), set by the pool
        self.on_stuck: Any = None  # callable(WorkerHandle, deadline), set by the pool

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
            _, ready = opened(await asyncio.wait_for(self._read(), timeout))
        except (asyncio.IncompleteReadError, ConnectionError, TimeoutError) as exc:
            self.process.kill()
            raise RuntimeError(f"worker {self.index} failed to start: {exc!r}") from exc
        assert isinstance(ready, Ready)
        self.pid = ready.pid
        self.warmed.update(ready.warmed)  # warmed before Ready (thread-bound envs)
        self.warming -= set(ready.warmed)
        self.alive = True
        self._read_task = asyncio.create_task(self._read_loop(), name=f"worker-{self.index}-read")

    async def _read(self) -> bytes:
        assert self._reader is not None
        return await read_framed(self._reader)

    async def _read_loop(self) -> None:
        try:
            while True:
                request_id, result = opened(await self._read())
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
        if self._watchdog is not None:
            self._watchdog.cancel()
            self._watchdog = None
        for future in self._pending.values():
            if not future.done():
                future.set_exception(self._lost())
        self._pending.clear()
        if self._writer is not None:
            self._writer.close()
        if self.process is not None:
            self.process.join(timeout=0)  # reap the zombie if it is already gone
        if not self._stopping and self.on_death is not None:
            self.on_death(self)

    async def request(
        self, batch: list[Message], deadline: float = 60.0, ahead: bool = False
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

        `ahead`: the batch is the next piece of one whose piece before it is in flight
        (`WorkerPool.pieces`). It goes as a message of its own, without waiting for that
        answer, as soon as nothing else is queued before it: the worker finds it in its
        pipe when it finishes the piece before, while this process reads that answer.
        """
        if not self.alive or self._writer is None:
            raise WorkerLost(f"worker {self.index} is not running")
        if not batch:
            return []
        loop = asyncio.get_running_loop()
        if not ahead and (self._in_flight or self._queue):  # (a piece does not find itself)
            self._overlaps.append(loop.time())
        future = loop.create_future()
        self._queue.append(_Queued(batch, future, deadline, ahead))
        self._queued_items += len(batch)
        if self._queued_items >= self.coalesce_max_items or self._ahead_may_go():
            self._flush()
        elif self._in_flight or self._timer is not None:
            pass  # sent when the message in flight answers, or the window closes
        elif self.coalesce_window > 0 and self.concurrent(loop.time()):
            self._timer = loop.call_later(self.coalesce_window, self._window_over)
        elif not self._flush_soon:
            self._flush_soon = True
            loop.call_soon(self._flush_now)
        return await future

    def _lost(self) -> WorkerLost:
        """What the calls in flight, or queued, fail with when the worker is gone."""
        if self.stuck_after is not None:
            return WorkerStuck(
                f"worker {self.index} (pid {self.pid}) was killed as stuck", self.stuck_after
            )
        return WorkerLost(f"worker {self.index} (pid {self.pid}) died")

    def _watch(self) -> None:
        """Arm the stuck check (`stuck`) while messages are in flight: one timer per
        worker, re-armed by each check, at a tenth of the oldest message's deadline (at
        most 1 s), so that a stuck worker is found at most that long after its deadline."""
        if self._watchdog is None and self._deadlines and self.alive and self.stuck_after is None:
            self._watchdog = asyncio.get_running_loop().call_later(
                min(1.0, self._deadlines[0] / 10), self._check_stuck
            )

    def _check_stuck(self) -> None:
        self._watchdog = None
        if not self.alive:
            return
        if self.stuck(asyncio.get_running_loop().time()):
            self.stuck_after = self._deadlines[0]  # its calls fail with WorkerStuck (`_lost`)
            if self.kill() and self.on_stuck is not None:
                self.on_stuck(self, self.stuck_after)
            return
        self._watch()

    def stuck(self, now: float) -> bool:
        """Whether the worker has spent longer than its deadline on one message: the clock
        runs from its last answer (or from the send, if it was idle), so a worker answering
        message after message of a long batch is busy, never stuck."""
        if not self._deadlines:
            return False
        # while it pre-warms an environment (a simulator's start-up: a minute), a create of
        # that environment waits for it: allowed on top of the deadline
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

    def _ahead_may_go(self) -> bool:
        """Whether the queue's first entry is a piece sent ahead that may go now: one
        message in flight at most (its piece before), so the worker holds two at most."""
        return bool(self._queue) and self._queue[0].ahead and self._in_flight < 2

    def _flush(self, force: bool = False) -> None:
        """Send the queue (in messages of at most coalesce_max_items items) while the worker
        has nothing in flight, or the queue is full, or `force` (the window is over), or a
        piece sent ahead is first (`request`); such a piece always travels alone."""
        if not self.alive or self._writer is None:
            lost = self._lost()
            while self._queue:
                entry = self._queue.popleft()
                if not entry.future.done():
                    entry.future.set_exception(lost)
            self._queued_items = 0
            return
        while self._queue and (
            force
            or self._in_flight == 0
            or self._queued_items >= self.coalesce_max_items
            or self._ahead_may_go()
        ):
            force = False
            entries: list[_Queued] = []
            items = 0
            while self._queue and (
                not entries
                or (
                    not entries[0].ahead
                    and not self._queue[0].ahead
                    and items + len(self._queue[0].batch) <= self.coalesce_max_items
                )
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
        self._watch()
        try:
            if len(entries) == 1:
                batch = entries[0].batch
            else:  # coalesced: one batch, answered in order and split back in _answered
                batch = [message for entry in entries for message in entry.batch]
            assert self._writer is not None
            self._writer.write(framed(envelope(request_id, batch)))
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
        """SIGKILL the process (a stuck worker, `_check_stuck`): its pipe closes, calls in
        flight fail with WorkerLost (WorkerStuck, then) and `on_death` replaces it, as for
        any death. False if it is not running. Once killed as stuck (`stuck_after`), its
        watchdog is not armed again, so it is killed once."""
        if self.process is None or not self.process.is_alive():
            return False
        self.process.kill()
        return True

    async def stop(self, timeout: float = 5.0) -> None:
        self._stopping = True
        if self.alive and self._writer is not None:
            try:
                self._writer.write(framed(envelope(0, Stop())))
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


class WorkerPool:
    """The worker processes of one service: `call` sends a batch to a worker, in pieces,
    under the deadline of its environments; a worker that dies (or is killed, stuck) is
    replaced, after `on_lost(handle)` has forgotten its sessions."""

    def __init__(
        self,
        settings: Settings,
        metrics: Metrics,
        on_lost: Callable[[WorkerHandle], None],
    ) -> None:
        self.settings = settings
        self.metrics = metrics
        self.on_lost = on_lost
        self.workers: list[WorkerHandle] = []
        self.restarts = 0
        self._ctx = multiprocessing.get_context(settings.start_method)
        self._restarts: set[asyncio.Task] = set()
        self._stopping = False
        self._limits: dict[frozenset[str], tuple[float, int]] = {}  # see `pieces`
        # seconds a worker takes per item, by (envs, message type), as measured (`pieces`)
        self._item_seconds: dict[tuple[frozenset[str], type], float] = {}

    async def start(self) -> None:
        if self.settings.start_method == "forkserver":
            self._ctx.set_forkserver_preload(["env_server.service.worker_process"])
        self.workers = [self._handle(i) for i in range(self.settings.workers)]
        await asyncio.gather(*(w.start() for w in self.workers))

    async def stop(self) -> None:
        self._stopping = True
        for task in list(self._restarts):
            task.cancel()
        await asyncio.gather(*(w.stop() for w in self.workers), return_exceptions=True)

    def _handle(self, index: int) -> WorkerHandle:
        settings = self.settings
        handle = WorkerHandle(
            index,
            self._ctx,
            settings.env_paths,
            coalesce_window=settings.coalesce_window,
            coalesce_max_items=settings.coalesce_max_items,
            prewarm=[e for e in settings.prewarm or () if e in (settings.envs or [e])],
            preload=settings.envs or [],
        )
        handle.on_death = self._on_death
        handle.on_stuck = self._on_stuck
        return handle

    def pick(self) -> WorkerHandle | None:
        """The alive worker holding the fewest sessions (None: none is alive)."""
        alive = [w for w in self.workers if w.alive]
        return min(alive, key=lambda w: len(w.sessions)) if alive else None

    async def call(
        self, worker: WorkerHandle, batch: list[Message], envs: Iterable[str] = ()
    ) -> list:
        """A batch for one worker: the answers of all its `pieces`, in order."""
        return [
            answer async for _, answers in self.pieces(worker, batch, envs) for answer in answers
        ]

    async def pieces(
        self, worker: WorkerHandle, batch: list[Message], envs: Iterable[str] = ()
    ) -> AsyncIterator[tuple[int, list]]:
        """A batch for one worker, sent in pieces: yields (position of the piece's first
        item, its answers) piece after piece, in order.

        A piece holds as many items as the worker works through in about `PIECE_SECONDS`
        (measured on the pieces of earlier batches, per set of environments and message
        type: a sokoban step takes a quarter of a millisecond, a frozenlake create 10-20
        ms), at most `piece_items` (the configured size, and the size before anything is
        measured). Each piece is sent before the answer of the one before it has been read
        (two in flight at most, `WorkerHandle.request`'s `ahead`): the worker goes on with
        the next piece while this process reads and finishes the answers of the last one. Other callers'
        requests queued meanwhile go between pieces, so another session's call waits for
        two pieces at most (tens of milliseconds), however big the batch, and each piece
        finishes well inside the deadline. If the worker dies, or spends longer than the
        deadline of the environments involved on one message (then it is killed and
        replaced), the items not yet answered answer SESSION_LOST."""
        key = frozenset(envs)
        limits = self._limits.get(key)
        if limits is None:  # the settings are fixed: once per set of envs (a few)
            limits = self._limits[key] = (self.deadline(key), self.piece_items(key))
        deadline, most = limits
        if not batch:
            return
        cost = (key, type(batch[0]))
        loop = asyncio.get_running_loop()
        if len(batch) <= self._piece_size(cost, most):  # one piece (most calls)
            # (not measured: its time includes waiting for others' messages in flight)
            yield 0, await self._call_piece(worker, batch, deadline)
            return
        # (start, its request, when it was asked for) of the pieces on their way
        sent: collections.deque[tuple[int, asyncio.Future, float]] = collections.deque()
        following = 0  # the first item not sent yet

        def send() -> None:
            nonlocal following
            size = self._piece_size(cost, most)
            piece = batch[following : following + size]
            ahead = bool(sent)  # the piece before it is on its way
            request = asyncio.ensure_future(self._call_piece(worker, piece, deadline, ahead))
            sent.append((following, request, loop.time()))
            following += len(piece)

        try:
            send()
            answered = float("-inf")  # when the piece before was answered
            while sent:
                if following < len(batch):
                    send()  # the next piece goes before this one's answer is read
                start, request, asked = sent[0]
                got = await request
                sent.popleft()
                now = loop.time()
                lost = bool(got) and isinstance(got[0], ServiceError) and got[0].code == (
                    "SESSION_LOST")  # fmt: skip
                if got and not lost:  # (a lost worker says nothing about the work)
                    # the worker began this piece when it had finished the one before, or
                    # when it was asked for, whichever came later
                    self._measured(cost, len(got), now - max(asked, answered))
                answered = now
                yield start, got
                if lost:
                    rest = len(batch) - start - len(got)  # the worker is gone
                    if rest:
                        yield start + len(got), [got[0]] * rest
                    return
        finally:
            for _, request, _ in sent:  # our caller gave up, or the worker was lost
                request.cancel()

    PIECE_SECONDS = 0.02  # the work of one piece of a batch (see `pieces`)

    def _piece_size(self, cost: tuple[frozenset[str], type], most: int) -> int:
        seconds = self._item_seconds.get(cost)
        if seconds is None:
            return most
        return max(1, min(most, int(self.PIECE_SECONDS / max(seconds, 1e-6))))

    def _measured(self, cost: tuple[frozenset[str], type], items: int, seconds: float) -> None:
        """Fold one piece's time per item into the estimate (a moving average)."""
        per_item = seconds / items
        before = self._item_seconds.get(cost)
        self._item_seconds[cost] = per_item if before is None else 0.7 * before + 0.3 * per_item

    async def _call_piece(
        self, worker: WorkerHandle, batch: list[Message], deadline: float, ahead: bool = False
    ) -> list:
        """One piece's answers; if the worker is killed as stuck (its watchdog,
        `WorkerHandle._watch`) or dies, SESSION_LOST for each item. A caller that gives up
        cancels the request: a piece still queued is then not sent."""
        try:
            answers = await worker.request(batch, deadline, ahead)
        except WorkerStuck as exc:
            op = type(batch[0]).__name__.lower()
            lost = ServiceError(
                "SESSION_LOST",
                f"the session's worker process did not answer {op} within "
                f"{exc.deadline:g} s (no answer to any message for that long: a stuck "
                "environment?); it was killed and is being replaced: create a new session",
            )
            return [lost] * len(batch)
        except WorkerLost as exc:
            lost = ServiceError("SESSION_LOST", f"the session's worker process died: {exc}")
            return [lost] * len(batch)
        except Exception as exc:  # e.g. a message that can't be pickled: a bug, never raised
            # out of the batch, so that each item answers (and a create frees its slot)
            return [ServiceError.internal(exc, f"sending {type(batch[0]).__name__}", log)] * len(
                batch
            )
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

    def _on_stuck(self, worker: WorkerHandle, deadline: float) -> None:
        """A worker's watchdog killed it (`WorkerHandle._check_stuck`)."""
        log.error(
            "worker %d (pid %s) did not answer a message within %g s: killed it; its %d "
            "sessions are lost", worker.index, worker.pid, deadline, len(worker.sessions),
        )  # fmt: skip
        self.metrics.worker_timeouts.inc()

    def _on_death(self, handle: WorkerHandle) -> None:
        """A worker died (or was killed): its sessions are lost; a new one takes its place."""
        if self._stopping:
            return
        self.on_lost(handle)
        handle.sessions.clear()
        self.restarts += 1
        self.metrics.worker_restarts.inc()
        replacement = self._handle(handle.index)
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
