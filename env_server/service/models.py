"""Request models (pydantic, validated at the boundary) and reply types (dataclasses).

Requests follow docs/wire.md; REST uses these models directly as bodies and gRPC
builds them from its messages. Replies are plain dataclasses made in the worker
processes: `SessionReply` (with images as `EncodedImage` bytes) or `ServiceError`.
`to_json()` gives the JSON shape of docs/wire.md (images base64-encoded).
"""

from __future__ import annotations

import base64
import logging
import secrets
from dataclasses import dataclass, field
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from env_server.core.types import Representation, ResponseFormat

ImageEncoding = Literal["png", "jpeg", "raw"]

# HTTP status of each wire error code (docs/wire.md, "Errors")
HTTP_STATUS: dict[str, int] = {
    "INVALID_ARGUMENT": 422,
    "NOT_FOUND": 404,
    "SESSION_LOST": 410,
    "CAPACITY": 429,
    "PAYLOAD_TOO_LARGE": 413,
    "FAILED_PRECONDITION": 409,
    "UNAVAILABLE": 503,
    "UNAUTHENTICATED": 401,
    "INTERNAL": 500,
}


# ---------------------------------------------------------------------------- requests
class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class SessionOptions(_Strict):
    """Options of a new session (fixed at creation)."""

    env: str = Field(description="Registry name, e.g. 'sokoban'.")
    config: dict[str, Any] = Field(default_factory=dict, description="The environment's config.")
    seed: int = Field(0, description="Seed of the first episode.")
    format: ResponseFormat = ResponseFormat.GROUNDING_WORLDMODELING
    representation: Representation = Representation.NATURAL
    reasoning: dict[str, Any] = Field(
        default_factory=dict, description="Reward options (ReasoningConfig fields)."
    )
    image_encoding: ImageEncoding = "png"


class ResetBody(_Strict):
    """REST body of POST /v1/sessions/{id}/reset."""

    seed: int | None = Field(None, description="Unset: the session's previous seed + 1.")
    image_encoding: ImageEncoding | None = Field(None, description="Override for this reply.")


class ResetItem(ResetBody):
    session_id: str


class ActionModel(_Strict):
    name: str
    args: list[float] = Field(default_factory=list)
    payload: str | None = None


class StepBody(_Strict):
    """REST body of POST /v1/sessions/{id}/step: a response text or explicit actions."""

    step_index: int = Field(
        ge=0, description="The index the client believes is next (docs/wire.md)."
    )
    response: str | None = Field(None, description="The agent's raw response text.")
    actions: list[ActionModel] | None = Field(
        None, description="Explicit actions (manual play): no format or world-model reward."
    )
    image_encoding: ImageEncoding | None = Field(None, description="Override for this reply.")

    @model_validator(mode="after")
    def _one_input(self) -> StepBody:
        if (self.response is None) == (self.actions is None):
            raise ValueError("give exactly one of 'response' or 'actions'")
        return self


class StepItem(StepBody):
    session_id: str


class BatchCreate(_Strict):
    items: list[dict[str, Any]] = Field(
        description="SessionOptions objects; each is validated and answered on its own."
    )


class BatchReset(_Strict):
    items: list[dict[str, Any]] = Field(description="ResetItem objects: {session_id, seed?}.")


class BatchStep(_Strict):
    items: list[dict[str, Any]] = Field(
        description="StepItem objects: {session_id, step_index, response | actions}."
    )


class BatchClose(_Strict):
    session_ids: list[str]


MAX_FORKS = 256  # per fork item; the session cap is checked as well


class ForkBody(_Strict):
    """REST body of POST /v1/sessions/{id}/fork."""

    n: int = Field(1, ge=1, le=MAX_FORKS, description="How many forks of the session to make.")


class ForkItem(ForkBody):
    session_id: str


class BatchFork(_Strict):
    items: list[dict[str, Any]] = Field(description="ForkItem objects: {session_id, n}.")


# ---------------------------------------------------------------------------- replies
class ServiceError(Exception):
    """A structured error: a wire code, a message a person can act on, the field at fault."""

    def __init__(self, code: str, message: str, field: str | None = None) -> None:
        super().__init__(message)
        self.code = code
        self.message = message
        self.field = field
        self.error_id: str | None = None  # INTERNAL errors: the id the server log carries

    def __reduce__(self):  # picklable across worker pipes
        return (_rebuild_error, (self.code, self.message, self.field, self.error_id))

    def __repr__(self) -> str:
        return f"ServiceError({self.code!r}, {self.message!r}, field={self.field!r})"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, ServiceError) and (self.code, self.message, self.field) == (
            other.code,
            other.message,
            other.field,
        )

    __hash__ = Exception.__hash__

    @property
    def http_status(self) -> int:
        return HTTP_STATUS.get(self.code, 500)

    def to_json(self) -> dict[str, Any]:
        out = {"code": self.code, "message": self.message, "field": self.field}
        if self.error_id is not None:
            out["error_id"] = self.error_id
        return out

    @classmethod
    def internal(cls, exc: BaseException, where: str, logger: logging.Logger) -> ServiceError:
        """INTERNAL for an unexpected exception (a bug): the reply carries an error id, and
        the traceback is logged with the same id, so an operator can find one from the other."""
        error_id = f"err-{secrets.token_hex(6)}"
        logger.error(
            "INTERNAL %s in %s: %s: %s", error_id, where, type(exc).__name__, exc, exc_info=exc
        )
        error = cls(
            "INTERNAL",
            f"internal error {error_id} in {where}: {type(exc).__name__}: {exc} "
            "(the server log has the traceback under this id)",
        )
        error.error_id = error_id
        return error

    @classmethod
    def from_validation(cls, exc: ValidationError, prefix: str = "") -> ServiceError:
        """INVALID_ARGUMENT naming the first bad field (pydantic's error location)."""
        err = exc.errors()[0]
        loc = ".".join(str(p) for p in err["loc"])
        name = ".".join(p for p in (prefix, loc) if p) or None
        return cls("INVALID_ARGUMENT", f"{name or 'request'}: {err['msg']}", name)


def _rebuild_error(code: str, message: str, field: str | None, error_id: str | None):
    error = ServiceError(code, message, field)
    error.error_id = error_id
    return error


@dataclass
class EncodedImage:
    encoding: str  # png | jpeg | raw (H*W*3 uint8 RGB bytes, row-major)
    data: bytes
    shape: tuple[int, int, int]

    def to_json(self) -> dict[str, Any]:
        return {
            "encoding": self.encoding,
            "data": base64.b64encode(self.data).decode("ascii"),
            "shape": list(self.shape),
        }


@dataclass
class ObservationReply:
    text: str
    images: list[EncodedImage]
    ground_truth: dict[str, Any]
    info: dict[str, Any] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return {
            "text": self.text,
            "images": [im.to_json() for im in self.images],
            "ground_truth": self.ground_truth,
            "info": self.info,
        }


@dataclass
class RewardParts:
    env: float = 0.0
    format: float = 0.0
    observation: float = 0.0
    prediction: float = 0.0
    penalty: float = 0.0

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


@dataclass
class SessionReply:
    """docs/wire.md's SessionReply. `info` is StepInfo (empty on create/reset)."""

    session_id: str
    env: str
    step_index: int  # steps applied since the last reset = the index the next step carries
    episode: int  # 0 for the first episode, +1 on every reset
    turn: int  # turns taken in this episode (equals step_index)
    observation: ObservationReply
    reward: float
    reward_parts: RewardParts
    terminated: bool
    truncated: bool
    success: bool
    info: dict[str, Any]
    system_prompt: str | None = None  # create/reset replies only

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
        if self.system_prompt is not None:
            out["system_prompt"] = self.system_prompt
        return out


@dataclass
class EnvSpec:
    """One entry of list_envs()."""

    name: str
    description: str
    available: bool
    unavailable_reason: str | None
    config_schema: dict[str, Any]
    action_space: dict[str, Any] | None
    enabled: bool = True

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


BatchResult = SessionReply | ServiceError


def batch_item_json(result: BatchResult) -> dict[str, Any]:
    """docs/wire.md's BatchItem."""
    if isinstance(result, ServiceError):
        return {"ok": False, "error": result.to_json()}
    return {"ok": True, "reply": result.to_json()}


ForkResult = list[SessionReply] | ServiceError


def fork_item_json(result: ForkResult) -> dict[str, Any]:
    """One item of a batch fork: the forks' replies, or the error that refused it whole."""
    if isinstance(result, ServiceError):
        return {"ok": False, "error": result.to_json()}
    return {"ok": True, "replies": [r.to_json() for r in result]}


# ---------------------------------------------------------------------------- reply docs
# Pydantic mirrors of the JSON replies, for the OpenAPI page only (replies are built from
# the dataclasses above without validation: they are the hot path).
class ImageDoc(BaseModel):
    encoding: ImageEncoding
    data: str = Field(description="base64 of the PNG/JPEG file, or of the raw H*W*3 RGB bytes")
    shape: list[int] = Field(description="[height, width, 3]")


class ObservationDoc(BaseModel):
    text: str = Field(description="one '<image>' placeholder per image, in order")
    images: list[ImageDoc]
    ground_truth: dict[str, Any]
    info: dict[str, Any]


class RewardPartsDoc(BaseModel):
    env: float
    format: float
    observation: float
    prediction: float
    penalty: float


class SessionReplyDoc(BaseModel):
    session_id: str
    env: str
    step_index: int = Field(description="steps applied since the last reset: the next step's index")
    episode: int
    turn: int
    observation: ObservationDoc
    reward: float = Field(description="the sum of reward_parts")
    reward_parts: RewardPartsDoc
    terminated: bool
    truncated: bool
    success: bool
    info: dict[str, Any] = Field(
        description="StepInfo: action_valid, actions_executed, actions, invalid_actions, "
        "parse_error, observation_score, prediction_score, judge_error, env extras"
    )
    system_prompt: str | None = Field(None, description="create/reset replies only")


class ErrorDoc(BaseModel):
    code: str
    message: str
    field: str | None
    error_id: str | None = Field(None, description="INTERNAL only: the id in the server log")


class ErrorReplyDoc(BaseModel):
    error: ErrorDoc


class BatchItemDoc(BaseModel):
    ok: bool
    reply: SessionReplyDoc | None = None
    error: ErrorDoc | None = None


class BatchReplyDoc(BaseModel):
    results: list[BatchItemDoc]


class ForkReplyDoc(BaseModel):
    replies: list[SessionReplyDoc] = Field(
        description="one per fork: the source's last reply under the fork's session_id; "
        "info.fork = {source, exact, tolerance}"
    )


class ForkItemDoc(BaseModel):
    ok: bool
    replies: list[SessionReplyDoc] | None = None
    error: ErrorDoc | None = None


class BatchForkReplyDoc(BaseModel):
    results: list[ForkItemDoc]


class CloseItemDoc(BaseModel):
    ok: bool
    error: ErrorDoc | None = None


class CloseReplyDoc(BaseModel):
    results: list[CloseItemDoc]
