"""The batch calls' envelopes: a batch reply's items (a reply or the error that refused
it), a fork's, a close's and a frame's, in their JSON form (`*_json`, `*_from_json`) and
their proto form (`*_to_proto`, `*_from_proto`), and a step's request (`step_request`).

The JSON shapes of REST's replies (docs/wire.md) are declared as TypedDicts (`BatchItem`,
`BatchResponse`, ...): with the dataclasses they are what the OpenAPI document's schemas
are generated from (pydantic reads them; descriptions are the attributes' docstrings).
gRPC's are the proto's messages of the same names."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any, NotRequired

from typing_extensions import TypedDict  # pydantic reads typing's only from Python 3.12

from visenv.v1 import visenv_pb2 as pb

from . import convert
from .errors import Error, ErrorLike
from .replies import EnvSpec, R, SessionReply
from .requests import StepItem
from .schema import SCHEMA


class BatchItem(TypedDict):
    """One item of a batch reply: the session's reply, or the error that refused it."""

    ok: bool
    """True: `reply` is set; false: `error` is."""
    reply: NotRequired[SessionReply]
    """The session's reply (when ok)."""
    error: NotRequired[Error]
    """Why this item was refused (when not ok); the other items are unaffected."""


class BatchResponse(TypedDict):
    """The reply of a batch create, reset or step."""

    results: list[BatchItem]
    """One per request item, in order."""


class ForkedSessions(TypedDict):
    """The reply of a fork: the new sessions."""

    replies: list[SessionReply]
    """One per fork: the source's last reply under the fork's session_id, with
    info.fork = {source, exact, tolerance}."""


class ForkResult(TypedDict):
    """One fork item: its forks' replies, or the one error that refused it whole."""

    ok: bool
    """True: `replies` is set; false: `error` is."""
    replies: NotRequired[list[SessionReply]]
    """One per fork (when ok), as in ForkedSessions."""
    error: NotRequired[Error]
    """Why the item was refused (when not ok): no fork of it was made."""


class ForkResponse(TypedDict):
    """The reply of a batch fork."""

    results: list[ForkResult]
    """One per request item, in order."""


class CloseResult(TypedDict):
    """One closed session, or why it could not be closed."""

    ok: bool
    """True: the session is closed."""
    error: NotRequired[Error]
    """Why not (when not ok), e.g. NOT_FOUND."""


class CloseResponse(TypedDict):
    """The reply of a batch close."""

    results: list[CloseResult]
    """One per session id, in order."""


class Limits(TypedDict):
    """The limits a server holds every request to, on every transport (GET /v1/limits)."""

    max_request_bytes: int
    """Largest request: a REST body, a gRPC message (413 / RESOURCE_EXHAUSTED beyond)."""
    max_batch_items: int
    """Most items in one call; a larger call is refused whole (INVALID_ARGUMENT, `items`)."""
    max_actions_per_step: int
    """Most explicit actions in one step item (INVALID_ARGUMENT, `actions`, beyond)."""
    max_forks_per_item: int
    """Most copies one fork item may ask for."""
    max_json_depth: NotRequired[int]
    """Deepest nesting of a free-form object (config, reasoning, a peer's data part)."""
    max_action_args: NotRequired[int]
    """Most numbers in one explicit action (actions that take none refuse any)."""
    max_sessions: int
    """Most sessions this server holds at once (CAPACITY beyond)."""
    items_per_worker_message: int
    """A batch is worked through in pieces of this many items."""
    seed: dict[str, Any]
    """Every environment's seed rule: {type: integer, minimum, maximum}."""


class ListEnvsResponse(TypedDict):
    """The environments this server knows."""

    envs: list[EnvSpec]
    """Every registered environment, with whether it is enabled and available here."""
    limits: NotRequired[Limits]
    """The limits this server holds every request to (as GET /v1/limits)."""


class ErrorReply(TypedDict):
    """The body of every REST error status."""

    error: Error
    """The error: its code, a readable message, and the field at fault (if one is)."""


# pydantic reads the envelopes' field docstrings too (the OpenAPI document's descriptions)
for _envelope in (BatchItem, BatchResponse, ForkedSessions, ForkResult, ForkResponse,
                  CloseResult, CloseResponse, ListEnvsResponse, ErrorReply):  # fmt: skip
    _envelope.__pydantic_config__ = SCHEMA  # type: ignore[attr-defined]


Answer = SessionReply | ErrorLike  # a batch item's answer: a reply or an error
Forks = list[SessionReply] | ErrorLike  # a fork item's answer


def batch_item_json(result: Answer) -> dict[str, Any]:
    if isinstance(result, SessionReply):
        return {"ok": True, "reply": result.to_json()}
    return {"ok": False, "error": Error.of(result).to_json()}


def fork_item_json(result: Forks) -> dict[str, Any]:
    if isinstance(result, list):
        return {"ok": True, "replies": [r.to_json() for r in result]}
    return {"ok": False, "error": Error.of(result).to_json()}


def close_item_json(error: ErrorLike | None) -> dict[str, Any]:
    return {"ok": True} if error is None else {"ok": False, "error": Error.of(error).to_json()}


def batch_to_proto(results: Iterable[Answer]) -> pb.BatchResponse:
    out = pb.BatchResponse()
    for r in results:
        if isinstance(r, SessionReply):
            r.fill_proto(out.results.add().reply)
        else:
            out.results.add(error=Error.of(r).to_proto())
    return out


def fork_to_proto(results: Iterable[Forks]) -> pb.ForkResponse:
    out = pb.ForkResponse()
    for r in results:
        if isinstance(r, list):
            forks = out.results.add().forks
            forks.SetInParent()
            for reply in r:
                reply.fill_proto(forks.replies.add())
        else:
            out.results.add(error=Error.of(r).to_proto())
    return out


def close_to_proto(errors: Iterable[ErrorLike | None]) -> pb.CloseResponse:
    out = pb.CloseResponse()
    for err in errors:
        if err is None:
            out.results.add(ok=True)
        else:
            out.results.add(ok=False, error=Error.of(err).to_proto())
    return out


def batch_from_json(
    data: dict[str, Any], reply_type: type[R] = SessionReply, **extra: Any
) -> list[R | Error]:
    """`extra`: the subclass fields of `reply_type` (as in SessionReply.from_json)."""
    return [
        reply_type.from_json(item["reply"], **extra)
        if item.get("ok")
        else Error.from_json(item.get("error") or {})
        for item in data["results"]
    ]


def fork_from_json(
    data: dict[str, Any], reply_type: type[R] = SessionReply, **extra: Any
) -> list[list[R] | Error]:
    return [
        [reply_type.from_json(r, **extra) for r in item["replies"]]
        if item.get("ok")
        else Error.from_json(item.get("error") or {})
        for item in data["results"]
    ]


def close_from_json(data: dict[str, Any]) -> list[Error | None]:
    return [None if r.get("ok") else Error.from_json(r.get("error") or {}) for r in data["results"]]


def batch_from_proto(
    msg: pb.BatchResponse, reply_type: type[R] = SessionReply, **extra: Any
) -> list[R | Error]:
    return [
        reply_type.from_proto(item.reply, **extra)
        if item.HasField("reply")
        else Error.from_proto(item.error)
        for item in msg.results
    ]


def fork_from_proto(
    msg: pb.ForkResponse, reply_type: type[R] = SessionReply, **extra: Any
) -> list[list[R] | Error]:
    return [
        [reply_type.from_proto(r, **extra) for r in item.forks.replies]
        if item.HasField("forks")
        else Error.from_proto(item.error)
        for item in msg.results
    ]


def close_from_proto(msg: pb.CloseResponse) -> list[Error | None]:
    return [None if r.ok else Error.from_proto(r.error) for r in msg.results]


def frames_to_proto(results: Iterable[bytes | ErrorLike]) -> pb.FrameResponse:
    """Frame's answer: each session's PNG, or its error."""
    out = pb.FrameResponse()
    for result in results:
        if isinstance(result, bytes):
            out.results.add(png=result)
        else:
            out.results.add(error=Error.of(result).to_proto())
    return out


def frames_from_proto(msg: pb.FrameResponse) -> list[bytes | Error]:
    return [r.png if r.HasField("png") else Error.from_proto(r.error) for r in msg.results]


def step_request(items: Iterable[StepItem]) -> pb.StepRequest:
    out = pb.StepRequest()
    add = out.items.add
    for item in items:
        convert.fill(item, add())
    return out
