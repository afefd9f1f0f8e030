"""The wire's errors: the error codes, read from the proto enum `ErrorCode` and its
options (`ERROR_CODES`, and the maps derived from it: `HTTP_STATUS`, `GRPC_STATUS`,
`code_of_http`, `code_of_grpc`), the structured `Error` that refuses a batch item or a
whole call, and a request field that can't be read (`InvalidField`, `json_object`)."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, Protocol

import grpc

from visenv.v1 import visenv_pb2 as pb

from .schema import SCHEMA

# trailing metadata key of a whole-call gRPC error: its wire code
CODE_METADATA_KEY = "visenv-code"


@dataclass(frozen=True)
class ErrorCode:
    """One wire error code and how it travels (the options of proto's `ErrorCode`)."""

    name: str
    http_status: int
    grpc_status: grpc.StatusCode
    also_http_status: tuple[int, ...] = ()  # also read as this code when they come bare
    also_grpc_status: tuple[grpc.StatusCode, ...] = ()
    client_only: bool = False  # the client's own (DEADLINE_EXCEEDED): no server answers it


def _read_error_codes() -> dict[str, ErrorCode]:
    codes = {}
    for value in pb.DESCRIPTOR.enum_types_by_name["ErrorCode"].values:
        if value.number == 0:
            continue
        ext = value.GetOptions().Extensions
        codes[value.name] = ErrorCode(
            name=value.name,
            http_status=ext[pb.http_status],
            grpc_status=grpc.StatusCode[ext[pb.grpc_status]],
            also_http_status=tuple(ext[pb.also_http_status]),
            also_grpc_status=tuple(grpc.StatusCode[s] for s in ext[pb.also_grpc_status]),
            client_only=ext[pb.client_only],
        )
    return codes


ERROR_CODES: dict[str, ErrorCode] = _read_error_codes()
HTTP_STATUS: dict[str, int] = {c.name: c.http_status for c in ERROR_CODES.values()}
GRPC_STATUS: dict[str, grpc.StatusCode] = {c.name: c.grpc_status for c in ERROR_CODES.values()}


def _status_to_code(primary: dict[str, Any], also: dict[str, tuple]) -> dict[Any, str]:
    """A status -> code map: a status shared by codes reads as the first of them (gRPC's
    INVALID_ARGUMENT is INVALID_ARGUMENT, not PAYLOAD_TOO_LARGE); an `also_*` status wins."""
    out: dict[Any, str] = {}
    for name, status in primary.items():
        out.setdefault(status, name)
    for name, statuses in also.items():
        out.update(dict.fromkeys(statuses, name))
    return out


_CODE_OF_HTTP = _status_to_code(
    HTTP_STATUS, {c.name: c.also_http_status for c in ERROR_CODES.values()}
)
_CODE_OF_GRPC = _status_to_code(
    GRPC_STATUS, {c.name: c.also_grpc_status for c in ERROR_CODES.values()}
)


def code_of_http(status: int, default: str = "INTERNAL") -> str:
    """The wire code of an HTTP status that came without a structured error body."""
    return _CODE_OF_HTTP.get(status, default)


def code_of_grpc(status: grpc.StatusCode, default: str = "INTERNAL") -> str:
    """The wire code of a gRPC status that came without `visenv-code` metadata (from grpc
    itself or a proxy: e.g. a bare RESOURCE_EXHAUSTED is grpc's message size limit)."""
    return _CODE_OF_GRPC.get(status, default)


# a client's channel to a visenv gRPC server (the SDK's and the gateway's): big messages


def rpc_error_code(exc: grpc.aio.AioRpcError) -> str | None:
    """The wire code a visenv servicer put in a whole-call error's trailing metadata;
    None when the error came from grpc itself or something on the way."""
    code = dict(exc.trailing_metadata() or ()).get(CODE_METADATA_KEY)
    return None if code is None else str(code)


class ErrorLike(Protocol):
    """What `Error.of` takes: an exception (or an `Error`) with a code, message and field."""

    code: str
    message: str
    field: str | None


@dataclass
class Error:
    """A structured error: what fails one batch item, or a whole call."""

    __pydantic_config__ = SCHEMA

    code: str
    """A wire error code (an `ErrorCode` name: INVALID_ARGUMENT, NOT_FOUND, SESSION_LOST, ...)."""
    message: str
    """What went wrong, in words a person can act on."""
    field: str | None = None
    """The request field at fault, when there is one."""
    error_id: str | None = None
    """INTERNAL only: the id under which the server logged the traceback."""

    @classmethod
    def of(cls, err: ErrorLike) -> Error:
        """The wire form of an exception with `code`, `message`, `field` (and `error_id`)."""
        if isinstance(err, Error):
            return err
        return cls(err.code, err.message, err.field, getattr(err, "error_id", None))

    @property
    def http_status(self) -> int:
        return HTTP_STATUS.get(self.code, 500)

    @property
    def grpc_status(self) -> grpc.StatusCode:
        return GRPC_STATUS.get(self.code, grpc.StatusCode.INTERNAL)

    def to_json(self) -> dict[str, Any]:
        out = {"code": self.code, "message": self.message, "field": self.field}
        if self.error_id is not None:
            out["error_id"] = self.error_id
        return out

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Error:
        return cls(
            str(data.get("code") or "INTERNAL"),
            str(data.get("message", "")),
            data.get("field"),
            data.get("error_id"),
        )

    def to_proto(self) -> pb.Error:
        return pb.Error(
            code=self.code, message=self.message, field=self.field, error_id=self.error_id
        )

    @classmethod
    def from_proto(cls, msg: pb.Error) -> Error:
        return cls(
            msg.code or "INTERNAL",
            msg.message,
            msg.field if msg.HasField("field") else None,
            msg.error_id if msg.HasField("error_id") else None,
        )


class InvalidField(ValueError):
    """A request field that can't be read (malformed JSON in a `*_json` field): the
    server answers INVALID_ARGUMENT naming `field`."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(message)
        self.field = field


def json_object(text: str, field: str) -> dict[str, Any]:
    """The JSON object of a proto `*_json` field ({} when empty); InvalidField otherwise."""
    if not text:
        return {}
    try:
        value = json.loads(text)
    except json.JSONDecodeError as exc:
        raise InvalidField(field, f"{field}: not valid JSON ({exc})") from None
    except RecursionError:  # the server bounds nesting far below this (MAX_JSON_DEPTH)
        raise InvalidField(field, f"{field}: JSON nested too deep to parse") from None
    if not isinstance(value, dict):
        raise InvalidField(field, f"{field}: must be a JSON object")
    return value
