"""The requests as clients build them: `SessionOptions`, `StepItem` (`Action`, also the
environments' action type), `ResetItem`, `ForkItem`. The server reads requests into its
own validated models (env_server/service/models.py), straight from the JSON or the proto
message. Each is declared against its proto message (`convert.declared`): its JSON and
proto forms, and the server's reading of the message, are generated from that (convert.py).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from visenv.v1 import visenv_pb2 as pb

from . import convert


@convert.declared(pb.SessionOptions)
@dataclass(frozen=True)
class SessionOptions:
    """Options of a new session, as a client sends them (docs/wire.md). None means the
    server's default; the server reads them into env_server.service.models.SessionOptions."""

    env: str
    config: dict[str, Any] = dataclasses.field(default_factory=dict)
    seed: int = 0
    format: str | None = None
    representation: str | None = None
    reasoning: dict[str, Any] = dataclasses.field(default_factory=dict)
    image_encoding: str | None = None

    def to_json(self) -> dict[str, Any]:
        return convert.to_json(self)

    def to_proto(self) -> pb.SessionOptions:
        return convert.to_proto(self)  # type: ignore[return-value]


@convert.declared(pb.Action)
@dataclass(frozen=True)
class Action:
    """One action, the same type from the wire to the environment: an explicit action of a
    step (manual play: skips response parsing and its rewards; the proto's `Action`), and
    each action `env_server.reasoning` parses from a response (`env_server.core.types`
    re-exports it). At the environment `name` is the canonical name from the action space
    (its own spelling, whatever case the agent used); `args` holds the numbers of a CALL
    action, `payload` the document of a DOCUMENT action."""

    name: str
    args: tuple[float, ...] = ()
    payload: str | None = None

    def to_json(self) -> dict[str, Any]:
        return convert.to_json(self)

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Action:
        return convert.from_fields(cls, data)


ActionSpec = Action  # the SDK's name for it (clients.ActionSpec)


@convert.declared(pb.StepItem)
@dataclass(frozen=True)
class StepItem:
    """One session's turn as a client sends it: the agent's response text, or explicit
    actions (the server reads it into env_server.service.models.StepItem)."""

    session_id: str
    step_index: int
    response: str | None = None
    actions: tuple[Action, ...] | None = None
    image_encoding: str | None = None  # an override for this reply

    def to_json(self) -> dict[str, Any]:
        return convert.to_json(self)


@convert.declared(pb.ResetItem)
@dataclass(frozen=True)
class ResetItem:
    """One session's new episode as a client asks for it: `seed` (None: the session's
    previous seed + 1) and an image encoding override for this reply."""

    session_id: str
    seed: int | None = None
    image_encoding: str | None = None


@convert.declared(pb.ForkItem)
@dataclass(frozen=True)
class ForkItem:
    """`n` new sessions in the exact state of session `session_id`."""

    session_id: str
    n: int = 1
