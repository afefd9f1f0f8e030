"""Request models (pydantic, validated at the boundary) and the server's error.

Requests follow docs/wire.md. Each is parsed once, at the adapter, into these models:
REST uses them as bodies (a batch's items are validated one by one by the service, so
that each answers its own error), gRPC builds them straight from its messages. The
service works with them and hands them on to the worker: `messages.Create` carries the
`SessionOptions`, `messages.Step` the `ActionModel`s, which the worker turns into the
environment's `Action`s. Replies are the wire types of `visenv.wire` (made in the
worker processes): a `SessionReply`, or a `ServiceError` (the error codes, their
statuses and the JSON/proto forms are `visenv.wire`'s as well).
"""

from __future__ import annotations

import logging
import math
import secrets
from collections.abc import Iterator
from typing import Annotated, Any

from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    Strict,
    ValidationError,
    ValidationInfo,
    model_validator,
)
from pydantic_core import PydanticCustomError

from env_server.core.env import SEED_LIMIT
from env_server.core.types import Representation, ResponseFormat
from visenv.wire import (
    EnvSpec,
    Error,
    ImageEncoding,
    RewardParts,
    SessionReply,
)


# ---------------------------------------------------------------------------- requests
class _Strict(BaseModel):
    # non-finite numbers (JSON's NaN/Infinity literals, a proto double) are refused here,
    # before anything is applied; free-form objects are walked by `json_problem`
    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)


# the seed rule of every environment (env_server.core.env.check_seed): an integer, not a
# bool or a string, in [0, 2**63)
Seed = Annotated[int, Strict(), Field(ge=0, lt=SEED_LIMIT)]
Count = Annotated[int, Strict()]  # an integer on the wire: never "0", 0.0 or true

# bounds of what one request may hold, checked here, before anything is applied (the same
# on every transport; published in GET /v1/limits)
MAX_JSON_DEPTH = 32  # nesting of a free-form object: config, reasoning, a peer's data part
MAX_ACTION_ARGS = 16  # numbers of one explicit action (primitive_skill's push takes 6)


def text_problem(value: str) -> str | None:
    """Why `value` can't be written as UTF-8 (a lone surrogate, e.g. JSON's "\\ud800"), or None."""
    try:
        value.encode("utf-8")
    except UnicodeEncodeError as exc:
        return f"not valid Unicode: a lone surrogate {value[exc.start]!r} at character {exc.start}"
    return None


def _text(value: str) -> str:
    problem = text_problem(value)
    if problem is not None:
        raise PydanticCustomError("unicode", problem)
    return value


Text = Annotated[str, AfterValidator(_text)]  # a string of valid Unicode


def nonfinite_places(value: Any, where: str) -> Iterator[str]:
    """Where the non-finite numbers (NaN, infinities: JSON can't hold them) in a JSON-like
    value sit: the one check, for requests' free-form objects (`json_problem`) and for
    every reply from a worker (rewards.writable)."""
    if isinstance(value, float):
        if not math.isfinite(value):
            yield where
    elif isinstance(value, dict):
        for key, item in value.items():
            yield from nonfinite_places(item, f"{where}.{key}")
    elif isinstance(value, list):
        for n, item in enumerate(value):
            yield from nonfinite_places(item, f"{where}.{n}")


def json_problem(value: Any, where: str, depth: int = 1) -> str | None:
    """Why a free-form JSON value can't be taken (nested deeper than MAX_JSON_DEPTH, a
    number that is not finite, a string or key that is not valid Unicode), naming where;
    None if it can."""
    if isinstance(value, str):
        problem = text_problem(value)
        return f"{where}: {problem}" if problem else None
    if isinstance(value, float):
        for place in nonfinite_places(value, where):
            return f"{place}: {value} is not a finite number"
    if isinstance(value, dict | list):
        if depth > MAX_JSON_DEPTH:
            return f"{where}: nested more than {MAX_JSON_DEPTH} deep (MAX_JSON_DEPTH)"
        pairs = value.items() if isinstance(value, dict) else enumerate(value)
        for key, item in pairs:
            problem = (isinstance(key, str) and text_problem(key)) or json_problem(
                item, f"{where}.{key!s}"[:200], depth + 1
            )
            if problem:
                return problem if problem.startswith(where) else f"{where}: key {problem}"
    return None


def _free_object(value: dict[str, Any], info: ValidationInfo) -> dict[str, Any]:
    problem = json_problem(value, str(info.field_name))
    if problem is not None:
        raise PydanticCustomError("json_value", problem)
    return value


FreeObject = Annotated[dict[str, Any], AfterValidator(_free_object)]


# Swagger UI's "Try it out" starts from each request model's first example (without one
# it makes up `{"additionalProp1": {}}` for free-form objects, which is refused); each
# succeeds as it stands (tests/api/test_openapi_examples.py executes them). The batch
# examples name a session by an id of the right shape: paste a real one to play it.
EXAMPLE_SESSION_ID = "s-0123456789abcdef.visenv-0.89abcdef"


def _example(value: dict[str, Any]) -> ConfigDict:
    return ConfigDict(json_schema_extra={"examples": [value]})


class SessionOptions(_Strict):
    """Options of a new session (fixed at creation)."""

    model_config = _example({"env": "sokoban", "seed": 7, "format": "no_think", "config": {}})

    env: Text = Field(description="Registry name, e.g. 'sokoban'.")
    config: FreeObject = Field(default_factory=dict, description="The environment's config.")
    seed: Seed = Field(0, description="Seed of the first episode: an integer in [0, 2**63).")
    format: ResponseFormat = Field(
        ResponseFormat.GROUNDING_WORLDMODELING,
        description="How responses are written and graded (the <think> sections they hold).",
    )
    representation: Representation = Field(
        Representation.NATURAL,
        description="How states are written: in the text, and in <observation>/<prediction>.",
    )
    reasoning: FreeObject = Field(
        default_factory=dict, description="Reward options (ReasoningConfig fields)."
    )
    image_encoding: ImageEncoding = Field(
        "png", description="How replies carry images: png, jpeg, or raw RGB bytes."
    )


class ResetBody(_Strict):
    """REST body of POST /v1/sessions/{id}/reset."""

    model_config = _example({"seed": 8})

    seed: Seed | None = Field(
        None, description="Unset: the session's previous seed + 1 (after 2**63 - 1: 0)."
    )
    image_encoding: ImageEncoding | None = Field(None, description="Override for this reply.")

    def item(self, session_id: str) -> ResetItem:
        """This body as the item of `session_id` (validated already: not again)."""
        return ResetItem.model_construct(session_id=session_id, **dict(self))


class ResetItem(ResetBody):
    session_id: Text


class ActionModel(_Strict):
    """One explicit action of a step, as validated; the worker makes it the environment's
    `Action` (`visenv.wire.Action`) with the action space's spelling of its name."""

    name: Text = Field(description="An action name of the env's action space, e.g. 'Left'.")
    args: list[Annotated[float, Strict()]] = Field(
        default_factory=list,
        max_length=MAX_ACTION_ARGS,
        description="Numbers of a call action, e.g. pick's x, y, z (none for the others).",
    )
    payload: Text | None = Field(None, description="The document of a document action (svg).")


class StepBody(_Strict):
    """REST body of POST /v1/sessions/{id}/step: a response text or explicit actions."""

    model_config = _example({"step_index": 0, "response": "<answer>Left, Up</answer>"})

    step_index: Count = Field(
        ge=0, description="The index the client believes is next (docs/wire.md)."
    )
    response: Text | None = Field(None, description="The agent's raw response text.")
    actions: list[ActionModel] | None = Field(
        None,
        min_length=1,
        description="Explicit actions (manual play): no format or world-model reward.",
    )
    image_encoding: ImageEncoding | None = Field(None, description="Override for this reply.")

    @model_validator(mode="after")
    def _one_input(self) -> StepBody:
        if (self.response is None) == (self.actions is None):
            raise ValueError("give exactly one of 'response' or 'actions'")
        return self

    def item(self, session_id: str) -> StepItem:
        """This body as the item of `session_id` (validated already: not again)."""
        return StepItem.model_construct(session_id=session_id, **dict(self))


class StepItem(StepBody):
    session_id: Text


class BatchCreate(_Strict):
    """REST body of POST /v1/batch/create."""

    model_config = _example({"items": [{"env": "sokoban", "seed": s, "format": "no_think"}
                                       for s in (0, 1)]})  # fmt: skip

    items: list[dict[str, Any]] = Field(
        description="SessionOptions objects; each is validated and answered on its own."
    )


class BatchReset(_Strict):
    """REST body of POST /v1/batch/reset."""

    model_config = _example({"items": [{"session_id": EXAMPLE_SESSION_ID, "seed": 3}]})

    items: list[dict[str, Any]] = Field(description="ResetItem objects: {session_id, seed?}.")


class BatchStep(_Strict):
    """REST body of POST /v1/batch/step."""

    model_config = _example({"items": [{"session_id": EXAMPLE_SESSION_ID, "step_index": 0,
                                        "response": "<answer>Left</answer>"}]})  # fmt: skip

    items: list[dict[str, Any]] = Field(
        description="StepItem objects: {session_id, step_index, response | actions}."
    )


class BatchClose(_Strict):
    """REST body of POST /v1/batch/close."""

    model_config = _example({"session_ids": [EXAMPLE_SESSION_ID]})

    session_ids: list[str] = Field(description="The sessions to close; each answered alone.")


MAX_FORKS = 256  # per fork item; the session cap is checked as well


class ForkBody(_Strict):
    """REST body of POST /v1/sessions/{id}/fork."""

    model_config = _example({"n": 2})

    n: Count = Field(1, ge=1, le=MAX_FORKS, description="How many forks of the session to make.")

    def item(self, session_id: str) -> ForkItem:
        """This body as the item of `session_id` (validated already: not again)."""
        return ForkItem.model_construct(session_id=session_id, **dict(self))


class ForkItem(ForkBody):
    session_id: Text


class BatchFork(_Strict):
    """REST body of POST /v1/batch/fork."""

    model_config = _example({"items": [{"session_id": EXAMPLE_SESSION_ID, "n": 2}]})

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
        return Error.of(self).http_status

    def to_json(self) -> dict[str, Any]:
        return Error.of(self).to_json()

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


# what a service answers for one item: its reply, or its error in its place
Result = SessionReply | ServiceError


def _rebuild_error(code: str, message: str, field: str | None, error_id: str | None):
    error = ServiceError(code, message, field)
    error.error_id = error_id
    return error


__all__ = [
    "MAX_ACTION_ARGS", "MAX_FORKS", "MAX_JSON_DEPTH", "SEED_LIMIT", "Seed", "Text", "json_problem", "nonfinite_places", "ActionModel", "BatchClose", "BatchCreate", "BatchFork", "BatchReset",
    "BatchStep", "EnvSpec", "ForkBody", "ForkItem", "ImageEncoding",
    "ResetBody", "ResetItem", "Result", "RewardParts", "ServiceError", "SessionOptions", "SessionReply",
    "StepBody", "StepItem",
]  # fmt: skip
