"""How a call on sessions reaches the workers: the steps every operation of `EnvService`
takes, in order (service.py writes each operation with them, top to bottom):

    results = [None] * len(items)                              # one per item, in order
    found = looked_up(sessions, items, StepItem, results)      # validated, sessions found
    found = await claim(sessions, found, results)              # one each, idle, still open
    todo = [Sent(pos, item, session, Step(...)) for ...]      # the operation's own checks
    await send(pool, sessions, todo, results, record)          # to the workers and back

An item that fails a step gets its error in `results` and goes no further; the others go
on. `record(part, answers, results)` is the operation's own: what a piece of answers
changes on its sessions, and each item's result.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any

from .messages import Message
from .models import ServiceError
from .pool import WorkerHandle, WorkerPool
from .protocol import validate
from .sessions import Session, Sessions


@dataclass
class Sent:
    """One item on its way to its session's worker."""

    pos: int  # the item's place in the call (and in its results)
    item: Any  # as validated (create: the options; close: the session id)
    session: Session
    message: Message  # what the worker is sent
    held: tuple[Session, ...] = ()  # more sessions busy until it is answered (a fork's new ones)


# what an operation does with a piece of its worker's answers (`send`):
# record them on their sessions and write each item's result
Recorder = Callable[[list[Sent], list, list], Awaitable[None]]


def validated(items: Sequence[Any], model: type, results: list) -> list[tuple[int, Any]]:
    """(position, item) of each item valid as `model`; the others' errors in `results`."""
    valid = []
    for pos, raw in enumerate(items):
        item = validate(model, raw)
        if isinstance(item, ServiceError):
            results[pos] = item
        else:
            valid.append((pos, item))
    return valid


def looked_up(
    sessions: Sessions, items: Sequence[Any], model: type, results: list
) -> list[tuple[int, Any, Session | ServiceError]]:
    """(position, item, its session or the error a call on its id answers)."""
    return [
        (pos, item, sessions.lookup(item.session_id))
        for pos, item in validated(items, model, results)
    ]


async def claim(
    sessions: Sessions,
    found: list[tuple[int, Any, Session | ServiceError]],
    results: list,
    twice: str = "appears twice in one batch",
    closing: bool = False,
) -> list[tuple[int, Any, Session]]:
    """The items whose session may be called now: each session once (an id given twice
    answers INVALID_ARGUMENT), after the calls in flight on it, still open (unless
    `closing`: close forgot them already). Return without an await after the wait: the
    caller marks them busy (`send`) before any other call can."""
    claimed: list[tuple[int, Any, Session]] = []
    seen: set[str] = set()
    for pos, item, session in found:
        if isinstance(session, ServiceError):
            results[pos] = session
        elif session.id in seen:
            results[pos] = ServiceError(
                "INVALID_ARGUMENT", f"session {session.id} {twice}", "session_id"
            )
        else:
            seen.add(session.id)
            claimed.append((pos, item, session))
    while busy := [s.busy for _, _, s in claimed if s.busy is not None]:
        await asyncio.wait(busy)
    live = []
    now = time.monotonic()
    for pos, item, session in claimed:
        if not closing and sessions.get(session.id) is not session:
            results[pos] = sessions.lookup(session.id)  # closed or lost meanwhile
            continue
        session.last_used = now
        live.append((pos, item, session))
    return live


async def send(
    pool: WorkerPool, sessions: Sessions, todo: list[Sent], results: list, record: Recorder
) -> None:
    """Mark the sessions busy, send each worker its items, and `record` each piece of
    answers as it comes; the sessions are released once their answers are recorded.

    Shielded: a caller that gives up (client gone) must not leave a call applied in the
    worker but unrecorded here (a step_index would drift, a session be unknown); the
    adapters rely on this and add no shield of their own."""
    loop = asyncio.get_running_loop()
    by_worker: dict[WorkerHandle, list[Sent]] = {}
    for sent in todo:  # busy from now on (no await since `claim`)
        for session in (sent.session, *sent.held):
            session.busy = loop.create_future()
        by_worker.setdefault(sent.session.worker, []).append(sent)
    if len(by_worker) == 1:  # one worker (most calls): no gather around its one task
        ((worker, group),) = by_worker.items()
        await asyncio.shield(_to_worker(pool, sessions, worker, group, results, record))
    elif by_worker:
        await asyncio.shield(asyncio.gather(
            *(_to_worker(pool, sessions, w, g, results, record) for w, g in by_worker.items())
        ))  # fmt: skip


async def _to_worker(
    pool: WorkerPool,
    sessions: Sessions,
    worker: WorkerHandle,
    group: list[Sent],
    results: list,
    record: Recorder,
) -> None:
    """One worker's part of a call: each piece of its answers is recorded as it comes,
    while the worker goes on with the next piece (`WorkerPool.pieces`)."""
    recording = []
    try:
        messages = [sent.message for sent in group]
        envs = [sent.session.env for sent in group]
        try:
            async for start, answers in pool.pieces(worker, messages, envs):
                part = group[start : start + len(answers)]
                if start + len(answers) == len(group):  # the last (or only) piece
                    await record(part, answers, results)
                else:
                    recording.append(asyncio.ensure_future(record(part, answers, results)))
        finally:  # every answer recorded before its session is released
            if recording:
                await asyncio.gather(*recording)
    finally:
        for sent in group:
            for session in (sent.session, *sent.held):
                sessions.release(session)
