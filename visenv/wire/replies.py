"""The replies as they travel: `SessionReply` (its `Observation`, `Image`s and
`RewardParts`) and `EnvSpec`, each with `to_json` / `from_json` (docs/wire.md's JSON,
images as base64) and its proto form (free-form JSON objects as text in `*_json` fields).

Replies are plain dataclasses, built without validation (they are the hot path).
`SessionReply`, `RewardParts` and `EnvSpec` are mutable: the server fills in a step's
reward parts as grading finishes."""

from __future__ import annotations

import base64
import dataclasses
import io
import json
import math
from dataclasses import dataclass
from typing import Any, Literal, TypeVar

import numpy as np

from visenv.v1 import visenv_pb2 as pb

from .json_text import JSONText, _reduce_to_fields
from .schema import SCHEMA

ImageEncoding = Literal["png", "jpeg", "raw"]


@dataclass(frozen=True)
class Image:
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

    def to_json(self) -> dict[str, Any]:
        return {
            "encoding": self.encoding,
            "data": base64.b64encode(self.data).decode("ascii"),
            "shape": list(self.shape),
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Image:
        return cls(data["encoding"], base64.b64decode(data["data"]), tuple(data.get("shape") or ()))

    def to_proto(self) -> pb.Image:
        return pb.Image(encoding=self.encoding, data=self.data, shape=self.shape)

    @classmethod
    def from_proto(cls, msg: pb.Image) -> Image:
        return cls(msg.encoding, msg.data, tuple(msg.shape))  # type: ignore[arg-type]


@dataclass(frozen=True)
class Observation(JSONText):
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

    def to_json(self) -> dict[str, Any]:
        return {
            "text": self.text,
            "images": [im.to_json() for im in self.images],
            "ground_truth": self.ground_truth,
            "info": self.info,
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Observation:
        return cls(
            text=data["text"],
            images=tuple(Image.from_json(im) for im in data.get("images", ())),
            ground_truth=data.get("ground_truth") or {},
            info=data.get("info") or {},
        )

    def fill_proto(self, out: pb.Observation) -> None:
        out.text = self.text
        for im in self.images:
            out.images.add(encoding=im.encoding, data=im.data, shape=im.shape)
        out.ground_truth_json = self._dumps("ground_truth")
        out.info_json = self._dumps("info")

    @classmethod
    def from_proto(cls, msg: pb.Observation) -> Observation:
        # the JSON fields are decoded when read, not here (`JSONText`): a trainer seldom
        # reads the ground truth, and decoding it was a third of the SDK's CPU per step
        return cls.with_json(
            {"ground_truth": msg.ground_truth_json or "{}", "info": msg.info_json or "{}"},
            text=msg.text,
            images=tuple([Image.from_proto(im) for im in msg.images]),
        )


@dataclass
class RewardParts:
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

    def to_json(self) -> dict[str, float]:
        return {
            "env": self.env,
            "format": self.format,
            "observation": self.observation,
            "prediction": self.prediction,
            "penalty": self.penalty,
        }

    to_dict = to_json

    @classmethod
    def from_json(cls, data: dict[str, Any] | None) -> RewardParts:
        data = data or {}
        return cls(*(float(data.get(k, 0.0)) for k in _REWARD_PARTS))

    def fill_proto(self, out: pb.RewardParts) -> None:
        out.env = self.env
        out.format = self.format
        out.observation = self.observation
        out.prediction = self.prediction
        out.penalty = self.penalty

    @classmethod
    def from_proto(cls, msg: pb.RewardParts) -> RewardParts:
        return cls(msg.env, msg.format, msg.observation, msg.prediction, msg.penalty)


_REWARD_PARTS = tuple(f.name for f in dataclasses.fields(RewardParts))

R = TypeVar("R", bound="SessionReply")


@dataclass
class SessionReply(JSONText):
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
    """On create/reset replies only."""

    def __post_init__(self) -> None:
        if self.system_prompt is None:
            self.system_prompt = ""

    @property
    def done(self) -> bool:
        return self.terminated or self.truncated

    def to_json(self) -> dict[str, Any]:
        out = {
            "session_id": self.session_id,
            "env": self.env,
            "step_index": self.step_index,
            "episode": self.episode,
            "turn": self.turn,
            "observation": self.observation.to_json(),
            "reward": self.reward,
            "reward_parts": self.reward_parts.to_json(),
            "terminated": self.terminated,
            "truncated": self.truncated,
            "success": self.success,
            "info": self.info,
        }
        if self.system_prompt:
            out["system_prompt"] = self.system_prompt
        return out

    @classmethod
    def from_json(cls: type[R], data: dict[str, Any], **extra: Any) -> R:
        """`extra`: fields of a subclass (the SDK's reply adds `server`)."""
        return cls(
            session_id=data["session_id"],
            env=data.get("env", ""),
            step_index=int(data.get("step_index", 0)),
            episode=int(data.get("episode", 0)),
            turn=int(data.get("turn", 0)),
            observation=Observation.from_json(data["observation"]),
            reward=float(data.get("reward", 0.0)),
            reward_parts=RewardParts.from_json(data.get("reward_parts")),
            terminated=bool(data.get("terminated", False)),
            truncated=bool(data.get("truncated", False)),
            success=bool(data.get("success", False)),
            info=data.get("info") or {},
            system_prompt=data.get("system_prompt") or "",
            **extra,
        )

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
        out.session_id = self.session_id
        out.env = self.env
        out.step_index = self.step_index
        out.episode = self.episode
        out.turn = self.turn
        self.observation.fill_proto(out.observation)
        out.reward = self.reward
        self.reward_parts.fill_proto(out.reward_parts)
        out.terminated = self.terminated
        out.truncated = self.truncated
        out.success = self.success
        out.info_json = self._dumps("info")
        out.system_prompt = self.system_prompt or ""

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
            and all(math.isfinite(v) for v in parts.to_json().values())
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

    @classmethod
    def from_proto(cls: type[R], msg: pb.SessionReply, **extra: Any) -> R:
        return cls.with_json(  # info decoded when read, as the observation's JSON fields
            {"info": msg.info_json or "{}"},
            session_id=msg.session_id,
            env=msg.env,
            step_index=msg.step_index,
            episode=msg.episode,
            turn=msg.turn,
            observation=Observation.from_proto(msg.observation),
            reward=msg.reward,
            reward_parts=RewardParts.from_proto(msg.reward_parts),
            terminated=msg.terminated,
            truncated=msg.truncated,
            success=msg.success,
            system_prompt=msg.system_prompt,
            **extra,
        )


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
