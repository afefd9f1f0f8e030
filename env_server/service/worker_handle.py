"""The API process's end of one worker process's pipe: `WorkerHandle`.

It starts the worker process (`worker_process.worker_main`) and talks to it over the
pipe (`pipe.py`) without blocking; it coalesces concurrent callers' batches into one
message, with flush windows (`WorkerHandle.request`); it kills the worker when it has
spent longer than its deadline on one message (the watchdog, `WorkerHandle._watch`),
and fails the calls in flight with `WorkerLost` (`WorkerStuck`) when it dies.
`pool.WorkerPool` holds the handles.
"""

from __future__ import annotations

import asyncio
import collections
import functools
import itertools
import multiprocessing
import os
import socket
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from .messages import Message, Ready, Stop, Warmed
from .models import ServiceError
from .pipe import envelope, framed, opened, read_framed
from .worker_process import worker_main


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
