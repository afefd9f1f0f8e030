"""The replies as they travel: `SessionReply` (its `Observation`, `Image`s and
`RewardParts`) and `EnvSpec`, each with `to_json` / `from_json` (docs/wire.md's JSON,
images as base64) and its proto form (free-form JSON objects as text in `*_json` fields).
`SessionReply` and its parts are declared against their proto messages
(`convert.declared`): both forms are generated from that (convert.py).

Replies are plain dataclasses, built without validation (they are the hot path).
`SessionReply`, `RewardParts` and `EnvSpec` are mutable: the server fills in a step's
reward parts as grading finishes."""

from __future__ import annotations

import dataclasses
import io
import json
import math
from dataclasses import dataclass
from typing import Any, Literal, TypeVar

import numpy as np

from visenv.v1 import visenv_pb2 as pb

from . import convert
from .json_text import JSONText, _reduce_to_fields
from .schema import SCHEMA

ImageEncoding = Literal["png", "jpeg", "raw"]


class _Declared:
    """The conversions of a type declared against its proto message (`convert.declared`)."""

    def to_json(self) -> dict[str, Any]:
        return convert.to_json(self)

    @classmethod
    def from_json(cls: type[D], data: dict[str, Any], **extra: Any) -> D:
        """`extra`: fields of a subclass (the SDK's reply adds `server`)."""
        return convert.from_json(cls, data, **extra)

    def fill_proto(self, out: Any) -> None:
        """Write into the (empty) message `out` in place (no copy of nested messages)."""
        convert.fill(self, out)

    def to_proto(self) -> Any:
        return convert.to_proto(self)

    @classmethod
    def from_proto(cls: type[D], msg: Any, **extra: Any) -> D:
        return convert.from_message(cls, msg, **extra)


D = TypeVar("D", bound=_Declared)


@convert.declared(pb.Image, reply=True)
@dataclass(frozen=True)
class Image(_Declared):
    """One image as it travels: the encoded bytes, their encoding, and the image's shape.
    `to_array()` decodes it."""

    __pydantic_config__ = SCHEMA
    __reduce__ = _reduce_to_fields

    encoding: ImageEncoding
    """png, jpeg, or raw (the H*W*3 uint8 RGB bytes, row-major)."""
    data: bytes
    """The PNG/JPEG file or the raw bytes: base64 in JSON, bytes in gRPC."""
    shape: tuple[int, ...]
    """[height, width, 3]"""

    def to_array(self) -> np.ndarray:
        """The image as an (H, W, 3) uint8 RGB array."""
        if self.encoding == "raw":
            return np.frombuffer(self.data, dtype=np.uint8).reshape(self.shape)
        from PIL import Image as PILImage

        with PILImage.open(io.BytesIO(self.data)) as im:
            return np.asarray(im.convert("RGB"))

    def to_pil(self):
        """The image as a PIL.Image (RGB)."""
        from PIL import Image as PILImage

        return PILImage.fromarray(self.to_array())


@convert.declared(pb.Observation, reply=True)
@dataclass(frozen=True)
class Observation(JSONText, _Declared):
    """What the agent sees: text with one "<image>" placeholder per image, the images,
    the ground truth (the true state as JSON) and info (either may be held as JSON text:
    `JSONText`)."""

    __pydantic_config__ = SCHEMA

    text: str
    """One '<image>' placeholder per image, in order."""
    images: tuple[Image, ...]
    """The images the text's placeholders stand for, in order (svg: the target, then the
    agent's last rendering); empty for a text-only observation."""
    ground_truth: dict[str, Any]
    """The true state as JSON (the environment's own keys, e.g. sokoban's player, boxes,
    targets and walls); it may hold the answer, so never show it to the agent."""
    info: dict[str, Any] = dataclasses.field(default_factory=dict)
    """Extra facts about the observation from the environment (often empty)."""

    def __post_init__(self) -> None:
        if not isinstance(self.images, tuple):  # the server hands a list
            object.__setattr__(self, "images", tuple(self.images))

    # read from a message, the JSON fields stay text until read (`JSONText`): a trainer
    # seldom reads the ground truth, and decoding it was a third of the SDK's CPU per step


@convert.declared(pb.RewardParts, reply=True)
@dataclass
class RewardParts(_Declared):
    """A turn's reward by source; `reward` is their sum (`total`)."""

    __pydantic_config__ = SCHEMA
    __reduce__ = _reduce_to_fields

    env: float = 0.0
    """The environment's own reward for the actions (e.g. -0.1 a move, +10 at the goal)."""
    format: float = 0.0
    """The format reward: a well-formed response whose actions are all valid."""
    observation: float = 0.0
    """Weighted score of the <observation> against the true state before the step."""
    prediction: float = 0.0
    """Weighted score of the <prediction> against the true state after the step."""
    penalty: float = 0.0
    """Negative or 0: the reward-hacking guard's penalty for frequent low-scoring answers."""

    @property
    def total(self) -> float:
        return self.env + self.format + self.observation + self.prediction + self.penalty

    def to_dict(self) -> dict[str, float]:
        return convert.to_json(self)

    @classmethod
    def from_json(cls, data: dict[str, Any] | None, **extra: Any) -> RewardParts:
        return convert.from_json(cls, data or {}, **extra)


R = TypeVar("R", bound="SessionReply")


@convert.declared(pb.SessionReply, reply=True)
@dataclass
class SessionReply(JSONText, _Declared):
    """A server's answer for one session: its observation and, after a step, the reward
    (`info` may be held as JSON text: `JSONText`)."""

    __pydantic_config__ = SCHEMA

    session_id: str
    """The server-made id of the session (the path's {session_id})."""
    env: str
    """The environment's name, e.g. sokoban."""
    step_index: int
    """Steps applied since the last reset: the index the next step carries."""
    episode: int
    """0 for the first episode, +1 on every reset."""
    turn: int
    """Turns taken in this episode."""
    observation: Observation
    """What the agent sees now (after this step, or at the start of the episode)."""
    reward: float
    """The sum of reward_parts."""
    reward_parts: RewardParts
    """This step's reward by source (all 0 on create/reset)."""
    terminated: bool
    """The episode ended by the environment's rules (success or failure); reset to go on."""
    truncated: bool
    """The episode was cut off at its turn limit (max_turns); reset to go on."""
    success: bool
    """The task is solved (e.g. every box on a target)."""
    info: dict[str, Any]
    """StepInfo (empty on create/reset): action_valid, actions_executed, actions,
    invalid_actions, parse_error, observation_score, prediction_score, judge_error,
    env extras."""
    system_prompt: str = ""
    """On create/reset replies only (elsewhere "", and not sent)."""

    def __post_init__(self) -> None:
        if self.system_prompt is None:
            self.system_prompt = ""

    @property
    def done(self) -> bool:
        return self.terminated or self.truncated

    def to_proto(self) -> pb.SessionReply:
        out = pb.SessionReply()
        self.fill_proto(out)
        return out

    def fill_proto(self, out: pb.SessionReply) -> None:
        """Write into the (empty) message `out` in place (no copy of nested messages); a
        reply still held as its wire form, as those bytes."""
        data = self.wire_bytes()
        if data is not None:
            out.MergeFromString(data)
            return
        convert.fill(self, out)

    # ---- the wire form: how a reply crosses from the worker that finished it ----------
    def __reduce__(self) -> tuple:
        """Pickled as its wire form, the protobuf bytes of the reply (`wire_bytes`): the
        worker that finishes a reply writes what goes on the wire, and the API process
        hands those bytes to a gRPC reply unread (`fill_proto`); the reply is decoded only
        where it is read (a REST reply, a fork). A subclass (the SDK's reply), or a reply
        with a part held as its value rather than JSON text (then it may hold a non-finite
        number, for `writable` to find): `JSONText`'s way, field by field."""
        data = self.wire_bytes()
        if data is None and type(self) is SessionReply and self._all_text():
            data = self.to_proto().SerializeToString()
        if data is None:
            return JSONText.__reduce__(self)
        return _from_wire, (data,)

    def _all_text(self) -> bool:
        """Every number finite: the reward's, and those of the parts held as JSON text
        (the worker writes a part as text only when it holds none that is not)."""
        parts = self.reward_parts
        obs = self.observation
        return (
            type(parts) is RewardParts
            and type(obs) is Observation
            and math.isfinite(self.reward)
            and all(math.isfinite(v) for v in parts.to_dict().values())
            and self.json_text("info") is not None
            and obs.json_text("ground_truth") is not None
            and obs.json_text("info") is not None
        )

    def wire_bytes(self) -> bytes | None:
        """The reply's protobuf bytes while it is still held as them (unpickled from a
        worker, neither read nor changed since), else None. Such a reply's numbers are all
        finite (`__reduce__`)."""
        d = self.__dict__
        return d["_wire"] if len(d) == 1 and "_wire" in d else None

    def merged_wire(self, changes: pb.SessionReply) -> SessionReply | None:
        """This reply, still held as its wire form, with the fields `changes` sets written
        over it, unread: protobuf's merge, which appending a message's bytes is (a scalar
        set there wins, a message field merges field by field). None when this reply is
        not held as its wire form. A proto3 scalar at zero is not sent, so it can't
        overwrite: `changes` must set no field to zero that is not zero here."""
        data = self.wire_bytes()
        if data is None:
            return None
        return _from_wire(data + changes.SerializeToString())

    def _unwire(self) -> None:
        """Decode the wire form into the fields (a field set meanwhile keeps its value)."""
        d = self.__dict__
        data = d.pop("_wire", None)
        if data is not None:
            decoded = SessionReply.from_proto(pb.SessionReply.FromString(data)).__dict__
            for name, value in decoded.items():
                d.setdefault(name, value)

    def __getattr__(self, name: str) -> Any:  # only for a field not set yet
        if "_wire" in self.__dict__ and not name.startswith("_"):  # (not `copy`'s probes)
            self._unwire()
            return getattr(self, name)
        return JSONText.__getattr__(self, name)

    def json_text(self, name: str) -> str | None:
        self._unwire()
        return JSONText.json_text(self, name)

    def set_json_text(self, name: str, text: str) -> None:
        self._unwire()
        JSONText.set_json_text(self, name, text)


def _from_wire(data: bytes) -> SessionReply:
    """Unpickle a reply pickled as its wire form: held as the bytes until read."""
    reply = object.__new__(SessionReply)
    reply.__dict__["_wire"] = data
    return reply


@dataclass
class EnvSpec:
    """One environment as a server lists it."""

    __pydantic_config__ = SCHEMA

    name: str
    """The name sessions ask for, e.g. sokoban."""
    description: str
    """One sentence on the task."""
    available: bool
    """False when it can't run on this server (a missing backend)."""
    unavailable_reason: str | None
    """Why it can't run here (what is missing), or null."""
    config_schema: dict[str, Any]
    """The JSON schema of the environment's config."""
    action_space: dict[str, Any] | None
    """{kind, names, max_per_turn, arity, description}; null when unknown."""
    enabled: bool = True
    """False: registered, but this server was started without it."""

    def to_json(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "description": self.description,
            "available": self.available,
            "unavailable_reason": self.unavailable_reason,
            "config_schema": self.config_schema,
            "action_space": self.action_space,
            "enabled": self.enabled,
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> EnvSpec:
        return cls(
            name=data["name"],
            description=data.get("description", ""),
            available=bool(data.get("available", True)),
            unavailable_reason=data.get("unavailable_reason") or None,
            config_schema=data.get("config_schema") or {},
            action_space=data.get("action_space"),
            enabled=bool(data.get("enabled", True)),
        )

    def to_proto(self) -> pb.EnvInfo:
        return pb.EnvInfo(
            name=self.name,
            description=self.description,
            available=self.available,
            unavailable_reason=self.unavailable_reason or "",
            config_schema_json=json.dumps(self.config_schema),
            action_space_json=json.dumps(self.action_space),
            enabled=self.enabled,
        )

    @classmethod
    def from_proto(cls, msg: pb.EnvInfo) -> EnvSpec:
        return cls(
            name=msg.name,
            description=msg.description,
            available=msg.available,
            unavailable_reason=msg.unavailable_reason or None,
            config_schema=json.loads(msg.config_schema_json or "{}"),
            action_space=json.loads(msg.action_space_json or "null"),
            enabled=msg.enabled,
        )
