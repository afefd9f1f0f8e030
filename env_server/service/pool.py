"""The worker pool, the API process's side: `WorkerPool` and its handles, restarts.

Environments live in worker processes (`worker.Worker` holds a process's sessions and
answers its messages; `worker_process.worker_main` is a process's entry point, the
worker's end of the pipe). The API process's end of each pipe is a `WorkerHandle`
(`worker_handle.py`: the pipe, request batching, the watchdog). This module is the pool
of them: `WorkerPool`, the handles, the least-loaded pick, big batches sent in pieces,
the per-environment deadlines, killing a stuck worker, and replacing a worker that died.
"""

from __future__ import annotations

import asyncio
import collections
import logging
import multiprocessing
from collections.abc import AsyncIterator, Callable, Iterable

from .messages import Message
from .metrics import Metrics
from .models import ServiceError
from .settings import Settings
from .worker_handle import WorkerHandle, WorkerLost, WorkerStuck

log = logging.getLogger("visenv.service")


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
