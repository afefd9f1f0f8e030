"""The requests as clients build them: `SessionOptions`, `StepItem` (`Action`, also the
environments' action type), `ResetItem`, `ForkItem`. The server reads requests into its
own validated models (env_server/service/models.py), straight from the JSON or the proto
message."""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass
from typing import Any

from visenv.v1 import visenv_pb2 as pb


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
        out: dict[str, Any] = {
            "env": self.env,
            "config": self.config,
            "seed": self.seed,
            "reasoning": self.reasoning,
        }
        for key in ("format", "representation", "image_encoding"):
            if getattr(self, key) is not None:
                out[key] = getattr(self, key)
        return out

    def to_proto(self) -> pb.SessionOptions:
        return pb.SessionOptions(
            env=self.env,
            config_json=json.dumps(self.config) if self.config else "",
            seed=self.seed,
            format=self.format,
            representation=self.representation,
            reasoning_json=json.dumps(self.reasoning) if self.reasoning else "",
            image_encoding=self.image_encoding,
        )


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
        out: dict[str, Any] = {"name": self.name}
        if self.args:
            out["args"] = list(self.args)
        if self.payload is not None:
            out["payload"] = self.payload
        return out

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Action:
        return cls(
            name=str(data["name"]),
            args=tuple(data.get("args", ()) or ()),
            payload=data.get("payload"),
        )


ActionSpec = Action  # the SDK's name for it (clients.ActionSpec)


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
        out: dict[str, Any] = {"session_id": self.session_id, "step_index": self.step_index}
        if self.actions is not None:
            out["actions"] = [a.to_json() for a in self.actions]
        else:
            out["response"] = self.response or ""
        if self.image_encoding is not None:
            out["image_encoding"] = self.image_encoding
        return out

    def fill_proto(self, out: pb.StepItem) -> None:
        out.session_id = self.session_id
        out.step_index = self.step_index
        if self.actions is not None:
            out.actions.SetInParent()
            for a in self.actions:
                out.actions.actions.add(name=a.name, args=list(a.args), payload=a.payload)
        else:
            out.response = self.response or ""
        if self.image_encoding is not None:
            out.image_encoding = self.image_encoding


@dataclass(frozen=True)
class ResetItem:
    """One session's new episode as a client asks for it: `seed` (None: the session's
    previous seed + 1) and an image encoding override for this reply."""

    session_id: str
    seed: int | None = None
    image_encoding: str | None = None


@dataclass(frozen=True)
class ForkItem:
    """`n` new sessions in the exact state of session `session_id`."""

    session_id: str
    n: int = 1
