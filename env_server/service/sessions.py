"""Sessions: what the API process keeps of each session, and of those that are gone.

A `Session` is pinned to the worker that holds its environment; here are its retry state
(`step_index`, the last reply and the body of the last step applied), its reasoning
guard, and `busy`, set while a call on it is in flight (calls on one session are
serialised). `Sessions` is the table of the live ones, by id, with the memory of those
that are gone (closed, lost with their worker, reaped): what a later call on one answers.
"""

from __future__ import annotations

import asyncio
import collections
import time
from dataclasses import dataclass, field

from env_server.reasoning import ReasoningConfig, ResponseGuard

from .models import ServiceError, SessionOptions, SessionReply, StepItem
from .protocol import unknown_session
from .session_ids import Origin
from .worker_handle import WorkerHandle


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
    # the body of the last step applied (`step_key`): a retry must resend the same
    last_step: tuple | None = None

    def check_step_index(self, item: StepItem) -> SessionReply | ServiceError | None:
        """None: `item` is this session's next step, to apply. Else what it answers without
        its worker: the stored reply of a retry (the last step, resent with the same body),
        or why its step_index is wrong."""
        if item.step_index == self.step_index:
            return None
        if item.step_index == self.step_index - 1 and self.last_reply is not None:
            if self.last_step is not None and step_key(item) != self.last_step:
                return ServiceError(
                    "INVALID_ARGUMENT",
                    f"step_index {item.step_index} of {self.id} was already applied with "
                    "a different body; a retry must resend the same body (it then gets the "
                    f"stored reply), a new turn must use step_index {self.step_index}",
                    "step_index",
                )
            return self.last_reply  # a retry: answered from memory
        return ServiceError(
            "FAILED_PRECONDITION",
            f"step_index {item.step_index} is not the next step of {self.id}: "
            f"expected {self.step_index}",
            "step_index",
        )


def step_key(item: StepItem) -> tuple:
    """What makes two step bodies the same request (a retry), step_index aside."""
    actions = None
    if item.actions is not None:
        actions = tuple((a.name, tuple(a.args), a.payload) for a in item.actions)
    return item.response, actions, item.image_encoding


class Sessions(dict[str, Session]):
    """The live sessions by id (server-made ids naming this server: `origin`), and what a
    call on one that is gone answers (the `lost_memory` latest)."""

    def __init__(self, origin: Origin, lost_memory: int) -> None:
        super().__init__()
        self.origin = origin
        self.lost_memory = lost_memory
        self._gone: collections.OrderedDict[str, ServiceError] = collections.OrderedDict()

    def reserve(
        self, worker: WorkerHandle, options: SessionOptions, reasoning: ReasoningConfig, **state
    ) -> Session:
        """A new session on `worker`, counted towards the cap from now on (the call that
        makes it marks it busy until its worker did)."""
        session = Session(
            id=self.origin.new_id(),
            env=options.env,
            worker=worker,
            options=options,
            reasoning=reasoning,
            **state,
        )
        self[session.id] = session
        worker.sessions.add(session.id)
        return session

    def lookup(self, session_id: str) -> Session | ServiceError:
        """The live session, or the error a call on `session_id` answers."""
        session = self.get(session_id)
        if session is not None:
            return session
        gone = self._gone.get(session_id)
        if gone is not None:
            return gone
        return unknown_session(session_id)

    def forget(self, session: Session, reason: ServiceError | None = None) -> None:
        """Drop the session (and remember `reason` for later calls on it)."""
        if self.get(session.id) is session:
            del self[session.id]
        session.worker.sessions.discard(session.id)
        if reason is not None:
            self.remember(session.id, reason)

    def remember(self, session_id: str, reason: ServiceError) -> None:
        """What a later call on a session that is gone answers; the `lost_memory` latest."""
        if self.lost_memory <= 0:
            return
        self._gone[session_id] = reason
        self._gone.move_to_end(session_id)
        while len(self._gone) > self.lost_memory:
            self._gone.popitem(last=False)

    @staticmethod
    def release(session: Session) -> None:
        """The call on the session is over: the next may go."""
        if session.busy is not None and not session.busy.done():
            session.busy.set_result(None)
        session.busy = None

    def idle(self, timeout: float) -> list[Session]:
        """The sessions with nothing in flight, unused for longer than `timeout` seconds."""
        deadline = time.monotonic() - timeout
        return [s for s in self.values() if s.busy is None and s.last_used < deadline]
