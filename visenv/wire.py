"""The wire protocol's types, once: error codes, replies, requests, and their JSON and
proto forms (docs/wire.md; proto/visenv/v1/visenv.proto is the source).

Both the server (env_server/) and the SDK (clients/) import this module; it imports
neither of them (nor trainer/): only the code generated from the .proto.

- Error codes: `ERROR_CODES`, read from the proto enum `ErrorCode` and its options, and
  the maps derived from it: `HTTP_STATUS`, `GRPC_STATUS`, `code_of_http`, `code_of_grpc`.
- Replies: `SessionReply` (`Observation`, `Image`, `RewardParts`), `EnvSpec`, `Error`.
- Requests as clients build them: `SessionOptions`, `StepItem` (`Action`, also the
  environments' action type). The server reads requests into its own validated models
  (env_server/service/models.py), straight from the JSON or the proto message.
- Each has `to_json` / `from_json` (docs/wire.md's JSON, images as base64) and
  `to_proto` / `from_proto` (free-form JSON objects as text in `*_json` fields).
- The JSON envelopes of the batch calls (`BatchItem`, `BatchResponse`, ...) are declared
  as TypedDicts: with the dataclasses they are what the OpenAPI document's schemas are
  generated from (pydantic reads them; descriptions are the attributes' docstrings).

Replies are plain dataclasses, built without validation (they are the hot path).
`SessionReply`, `RewardParts` and `EnvSpec` are mutable: the server fills in a step's
reward parts as grading finishes.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import dataclasses
import io
import itertools
import json
import operator
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any, Literal, NotRequired, Protocol, TypeVar

import grpc
import numpy as np
from typing_extensions import TypedDict  # pydantic reads typing's only from Python 3.12

from visenv.v1 import visenv_pb2 as pb
from visenv.v1 import visenv_pb2_grpc as pb_grpc

# how pydantic reads these dataclasses for FastAPI's OpenAPI document: descriptions from
# the attributes' docstrings, bytes as base64 strings (schemas only: to_json writes the JSON)
_SCHEMA: dict[str, Any] = {"use_attribute_docstrings": True, "ser_json_bytes": "base64"}

# ---------------------------------------------------------------------------- error codes

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
# (raw images of a batch), and quick reconnects after a server restart
MAX_MESSAGE_BYTES = 256 * 1024 * 1024
CHANNEL_OPTIONS = [
    ("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
    ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
    ("grpc.initial_reconnect_backoff_ms", 100),
    ("grpc.min_reconnect_backoff_ms", 100),
    ("grpc.max_reconnect_backoff_ms", 1000),
]


def _streamed() -> dict[str, tuple[str, str]]:
    """Each unary method a `Calls` stream carries -> (its field in CallRequest's `call`,
    its reply's field in CallResponse's `result`), read from the proto: a call is the
    field whose message is the method's request, its reply the one whose message is the
    method's response."""
    service = pb.DESCRIPTOR.services_by_name["Visenv"]
    calls = pb.CallRequest.DESCRIPTOR.oneofs_by_name["call"].fields
    replies = pb.CallResponse.DESCRIPTOR.oneofs_by_name["result"].fields
    return {
        m.name: (
            next(f.name for f in calls if f.message_type is m.input_type),
            next(f.name for f in replies if f.message_type is m.output_type),
        )
        for m in service.methods
        if any(f.message_type is m.input_type for f in calls)
    }


# the calls a Channel sends over its `Calls` stream, when their request is at most
# STREAM_MAX_BYTES; a bigger call goes as a unary call of its own: its per-call cost is
# spread over many items, and a message over a server's size limit fails only that call
# (on the stream, it would end the stream, and every call in flight on it)
STREAMED = _streamed()
STREAM_MAX_BYTES = 64 * 1024


class Channel:
    """The visenv.v1 service of one server over one grpc.aio channel, every call with the
    bearer token (if any) and a deadline. `call` raises grpc's AioRpcError as it comes:
    each caller turns it into its own errors (the SDK's typed ones, the gateway's).

    With `stream` (the default), small calls travel over one long-lived `Calls` stream
    (proto: Visenv.Calls), several at a time, instead of one unary call each: the same
    answers and errors, at a third of grpc's CPU per call on both ends. A server without
    `Calls` (UNIMPLEMENTED) gets unary calls from then on."""

    def __init__(self, target: str, token: str | None, timeout: float, stream: bool = True) -> None:
        self.timeout = timeout
        self.channel = grpc.aio.insecure_channel(target, options=CHANNEL_OPTIONS)
        self.stub = pb_grpc.VisenvStub(self.channel)
        self.metadata = (("authorization", f"Bearer {token}"),) if token else None
        self.stream = stream
        self._calls: _CallStream | None = None

    async def call(self, method: str, request: Any) -> Any:
        field = STREAMED[method][0] if self.stream and method in STREAMED else None
        if field is not None and request.ByteSize() <= STREAM_MAX_BYTES:
            if self._calls is None or self._calls.over:
                self._calls = _CallStream(self.stub.Calls(metadata=self.metadata))
            # a call the stream could not carry goes as a unary call below: one that never
            # went out (the stream ended first), or one refused by a server without Calls
            # (nothing applied; every call from then on is unary)
            try:
                return await self._calls.send(field, request, self.timeout)
            except _NotSent as exc:
                self.stream = not _unimplemented(exc.error)
            except grpc.aio.AioRpcError as exc:
                if not _unimplemented(exc):
                    raise
                self.stream = False
        return await getattr(self.stub, method)(
            request, timeout=self.timeout, metadata=self.metadata
        )

    async def aclose(self) -> None:
        if self._calls is not None:
            await self._calls.aclose()
        await self.channel.close()


def _rpc_error(
    status: grpc.StatusCode, details: str, code: str | None = None
) -> grpc.aio.AioRpcError:
    """The AioRpcError a unary call would have raised (with `visenv-code` metadata when
    the visenv servicer answered `code`)."""
    trailing = grpc.aio.Metadata((CODE_METADATA_KEY, code)) if code else grpc.aio.Metadata()
    return grpc.aio.AioRpcError(status, grpc.aio.Metadata(), trailing, details)


class _CallStream:
    """One `Calls` stream of a Channel: requests are written one at a time (grpc allows
    one write in flight), answers are matched to their callers by id. When the stream
    ends, every call still waiting fails with its status (UNAVAILABLE if it ended
    cleanly: the server stopped), as a unary call cut off would; `over` then tells the
    Channel to open a new one."""

    def __init__(self, call: Any) -> None:
        self.call = call
        self.pending: dict[int, asyncio.Future] = {}
        self.ids = itertools.count(1)
        self.writing = asyncio.Lock()
        self.over = False
        self.error: grpc.aio.AioRpcError | None = None
        self.reader = asyncio.ensure_future(self._read())

    async def send(self, field: str, request: Any, timeout: float | None) -> Any:
        loop = asyncio.get_running_loop()
        call_id = next(self.ids)
        answer = loop.create_future()
        self.pending[call_id] = answer
        expiry = None
        if timeout is not None:
            expiry = loop.call_later(timeout, _expire, answer)
        try:
            try:
                async with self.writing:
                    await self.call.write(pb.CallRequest(id=call_id, **{field: request}))
            except (grpc.aio.AioRpcError, asyncio.InvalidStateError, grpc.aio.UsageError):
                # the stream ended before this request went out. Its status can't answer
                # the call: when the write races the end, grpc puts its own INTERNAL
                # "Internal error from Core" in place of the status the server sent
                await asyncio.shield(self.reader)
                if not answer.cancel():
                    answer.exception()  # the stream's end, set by the reader: seen, not ours
                raise _NotSent(self.error) from None
            response = await answer
        finally:
            if expiry is not None:
                expiry.cancel()
            self.pending.pop(call_id, None)
        kind = response.WhichOneof("result")
        if kind == "error":
            err = response.error
            status = GRPC_STATUS.get(err.code, grpc.StatusCode.INTERNAL)
            raise _rpc_error(status, err.message, err.code)
        return getattr(response, kind)

    async def aclose(self) -> None:
        """End the stream as a client ends a call: no more requests (a half-close), then
        the server answers what it has in flight and ends it, so that no grpc operation
        of the stream is left to complete after its event loop is gone (one cancelled
        instead did, at times: "Event loop is closed" from grpc's poller). A server that
        does not end it within a second gets it cancelled (the reader cancels the call)."""
        if not self.over:
            with contextlib.suppress(Exception):
                async with self.writing:
                    await asyncio.wait_for(self.call.done_writing(), 1.0)
                await asyncio.wait_for(asyncio.shield(self.reader), 1.0)
        self.reader.cancel()
        await asyncio.gather(self.reader, return_exceptions=True)

    async def _read(self) -> None:
        error = None
        try:
            async for response in self.call:
                answer = self.pending.get(response.id)
                if answer is not None and not answer.done():
                    answer.set_result(response)
        except grpc.aio.AioRpcError as exc:
            error = _broken(exc)
        except asyncio.CancelledError:
            error = _rpc_error(grpc.StatusCode.CANCELLED, "the channel was closed")
            self.call.cancel()
        finally:
            self.over = True
            self.error = error or _rpc_error(
                grpc.StatusCode.UNAVAILABLE, "the server ended the call stream (stopping?)"
            )
            for answer in self.pending.values():
                if not answer.done():
                    answer.set_exception(self.error)


class _NotSent(Exception):
    """A call on a `Calls` stream that ended before the call's request went out; `error`
    is the stream's end."""

    def __init__(self, error: grpc.aio.AioRpcError | None) -> None:
        self.error = error


def _unimplemented(exc: grpc.aio.AioRpcError | None) -> bool:
    """Whether `exc` says the server has no such method (not a visenv servicer's answer)."""
    return (
        exc is not None
        and exc.code() == grpc.StatusCode.UNIMPLEMENTED
        and rpc_error_code(exc) is None
    )


def _broken(exc: grpc.aio.AioRpcError) -> grpc.aio.AioRpcError:
    """What a call sent on a stream that ended with `exc` fails with: the stream's own
    status when it is an answer (a token refused, UNIMPLEMENTED, a message too large),
    else UNAVAILABLE, as a unary call cut off with its connection (grpc reports a send on
    a connection that died as INTERNAL "Internal error from Core")."""
    if rpc_error_code(exc) is not None or exc.code() != grpc.StatusCode.INTERNAL:
        return exc
    return _rpc_error(grpc.StatusCode.UNAVAILABLE, f"the call stream broke: {exc.details()}")


def _expire(answer: asyncio.Future) -> None:
    if not answer.done():
        answer.set_exception(_rpc_error(grpc.StatusCode.DEADLINE_EXCEEDED, "Deadline Exceeded"))


def rpc_error_code(exc: grpc.aio.AioRpcError) -> str | None:
    """The wire code a visenv servicer put in a whole-call error's trailing metadata;
    None when the error came from grpc itself or something on the way."""
    code = dict(exc.trailing_metadata() or ()).get(CODE_METADATA_KEY)
    return None if code is None else str(code)


class _ErrorLike(Protocol):
    code: str
    message: str
    field: str | None


@dataclass
class Error:
    """A structured error: what fails one batch item, or a whole call."""

    __pydantic_config__ = _SCHEMA

    code: str
    """A wire error code (an `ErrorCode` name: INVALID_ARGUMENT, NOT_FOUND, SESSION_LOST, ...)."""
    message: str
    """What went wrong, in words a person can act on."""
    field: str | None = None
    """The request field at fault, when there is one."""
    error_id: str | None = None
    """INTERNAL only: the id under which the server logged the traceback."""

    @classmethod
    def of(cls, err: _ErrorLike) -> Error:
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


# ---------------------------------------------------------------------------- replies

ImageEncoding = Literal["png", "jpeg", "raw"]


_FIELD_GETTERS: dict[type, Any] = {}


def _reduce_to_fields(self: Any) -> tuple[type, tuple]:
    """Pickle a reply dataclass as its class and field values (replies cross the worker
    pipe on every step: this is about 3x cheaper to load than pickle's default)."""
    cls = type(self)
    get = _FIELD_GETTERS.get(cls)
    if get is None:  # per class, so that a subclass (the SDK's reply) keeps its own fields
        get = _FIELD_GETTERS[cls] = operator.attrgetter(*(f.name for f in dataclasses.fields(cls)))
    return cls, get(self)


class JSONText:
    """Lets the JSON-object fields of a reply type be held as their JSON text, decoded only
    when read.

    A worker process writes a reply's ground truth and infos as JSON itself (in parallel
    with the other workers), and the server's API process hands that text to the gRPC
    reply unread instead of loading, checking and writing the objects again (`with_json`;
    the text is `json.dumps`'s with its defaults, what `fill_proto` writes, so the bytes
    on the wire are the same). Reading such a field decodes it once; a field that was read
    or set is written from its value again (`json_text` is None then), so a reader that
    changes the object it got never sends a stale text. Pickled with the text.
    """

    def __getattr__(self, name: str) -> Any:  # only for a field not set yet
        texts = self.__dict__.get("_json")
        if texts is None or name not in texts:
            raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")
        value = json.loads(texts[name])
        self.__dict__[name] = value
        return value

    @classmethod
    def with_json(cls, texts: dict[str, str], **values: Any):
        """An instance whose fields `texts` are given as JSON text, the rest as `values`
        (a field in neither takes its default)."""
        self = object.__new__(cls)
        for f in _field_defaults(cls):
            if f.name not in values and f.name not in texts:
                factory = f.default_factory
                values[f.name] = f.default if factory is dataclasses.MISSING else factory()
        self.__dict__.update(values)
        self.__dict__["_json"] = texts
        post_init = getattr(cls, "__post_init__", None)
        if post_init is not None:
            post_init(self)
        return self

    def json_text(self, name: str) -> str | None:
        """Field `name`'s JSON text while it was neither read nor set; else None."""
        d = self.__dict__
        if name in d:
            return None
        texts = d.get("_json")
        return None if texts is None else texts.get(name)

    def set_json_text(self, name: str, text: str) -> None:
        """Hold field `name` as this JSON text (`json.dumps`'s form) from now on."""
        d = self.__dict__
        d.pop(name, None)
        d["_json"] = {**(d.get("_json") or {}), name: text}

    def _dumps(self, name: str) -> str:
        """Field `name` as JSON text: the text it came as, or its value written now."""
        text = self.json_text(name)
        return json.dumps(getattr(self, name)) if text is None else text

    def __reduce__(self) -> tuple:
        d = self.__dict__
        texts = d.get("_json")
        if texts is not None:
            texts = {k: v for k, v in texts.items() if k not in d}
        if not texts:
            return _reduce_to_fields(self)
        names = _field_names(type(self))
        return _with_json, (type(self), tuple(d.get(n) for n in names), texts)


_FIELD_NAMES: dict[type, tuple[str, ...]] = {}


def _field_names(cls: type) -> tuple[str, ...]:
    names = _FIELD_NAMES.get(cls)
    if names is None:
        names = _FIELD_NAMES[cls] = tuple(f.name for f in dataclasses.fields(cls))
    return names


_FIELD_DEFAULTS: dict[type, tuple[dataclasses.Field, ...]] = {}


def _field_defaults(cls: type) -> tuple[dataclasses.Field, ...]:
    """The fields of `cls` that have a default (or a default factory)."""
    found = _FIELD_DEFAULTS.get(cls)
    if found is None:
        missing = dataclasses.MISSING
        found = _FIELD_DEFAULTS[cls] = tuple(
            f
            for f in dataclasses.fields(cls)
            if f.default is not missing or f.default_factory is not missing
        )
    return found


def _with_json(cls: type, values: tuple, texts: dict[str, str]) -> Any:
    """Unpickle a `JSONText` instance (its fields held as text are None in `values`)."""
    self = object.__new__(cls)
    d = self.__dict__
    for name, value in zip(_field_names(cls), values, strict=True):
        if name not in texts:
            d[name] = value
    d["_json"] = texts
    return self


@dataclass(frozen=True)
class Image:
    """One image as it travels: the encoded bytes, their encoding, and the image's shape.
    `to_array()` decodes it."""

    __pydantic_config__ = _SCHEMA
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

    __pydantic_config__ = _SCHEMA

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

    __pydantic_config__ = _SCHEMA
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

    __pydantic_config__ = _SCHEMA

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
        """Write into the (empty) message `out` in place (no copy of nested messages)."""
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

    def __reduce__(self) -> tuple:
        """Pickled flat: the reply, its observation, images and reward parts as one tuple
        of plain values rebuilt by one call (`_flat_reply`), instead of an object per
        part (every step's reply crosses a worker pipe: a step's answer pickles in 4.0
        µs instead of 6.8, unpickles in 4.7 instead of 5.3). A subclass (the SDK's
        reply) or parts of other types: `JSONText`'s way."""
        d = self.__dict__
        obs = d["observation"]
        parts = d["reward_parts"]
        if (
            type(self) is not SessionReply
            or type(obs) is not Observation
            or type(parts) is not RewardParts
        ):
            return JSONText.__reduce__(self)
        od = obs.__dict__
        images = []
        for im in od["images"]:
            if type(im) is not Image:
                return JSONText.__reduce__(self)
            images.append((im.encoding, im.data, im.shape))
        return _flat_reply, (
            d["session_id"], d["env"], d["step_index"], d["episode"], d["turn"],
            od["text"], images, od.get("ground_truth"), od.get("info"), _texts(od),
            d["reward"], parts.env, parts.format, parts.observation, parts.prediction,
            parts.penalty, d["terminated"], d["truncated"], d["success"], d.get("info"),
            _texts(d), d["system_prompt"],
        )  # fmt: skip

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


def _texts(d: dict[str, Any]) -> dict[str, str] | None:
    """The JSON texts a `JSONText` instance (its `__dict__`) still holds unread."""
    texts = d.get("_json")
    if texts is not None:
        texts = {k: v for k, v in texts.items() if k not in d}
    return texts or None


def _flat_reply(
    session_id: str, env: str, step_index: int, episode: int, turn: int,
    text: str, images: list[tuple], ground_truth: Any, obs_info: Any, obs_texts: dict | None,
    reward: float, env_r: float, format_r: float, observation_r: float, prediction_r: float,
    penalty: float, terminated: bool, truncated: bool, success: bool, info: Any,
    texts: dict | None, system_prompt: str,
) -> SessionReply:  # fmt: skip
    """Unpickle a `SessionReply` pickled flat (`SessionReply.__reduce__`): the objects are
    made without their `__init__` (the values were checked when the reply was made)."""
    new = object.__new__
    shown = []
    for encoding, data, shape in images:
        im = new(Image)
        im.__dict__.update(encoding=encoding, data=data, shape=shape)
        shown.append(im)
    obs = new(Observation)
    od = obs.__dict__
    od["text"] = text
    od["images"] = tuple(shown)
    if obs_texts is None:
        od["ground_truth"] = ground_truth
        od["info"] = obs_info
    else:
        if "ground_truth" not in obs_texts:
            od["ground_truth"] = ground_truth
        if "info" not in obs_texts:
            od["info"] = obs_info
        od["_json"] = obs_texts
    parts = new(RewardParts)
    parts.__dict__.update(
        env=env_r, format=format_r, observation=observation_r, prediction=prediction_r,
        penalty=penalty,
    )  # fmt: skip
    reply = new(SessionReply)
    d = reply.__dict__
    d.update(
        session_id=session_id, env=env, step_index=step_index, episode=episode, turn=turn,
        observation=obs, reward=reward, reward_parts=parts, terminated=terminated,
        truncated=truncated, success=success, system_prompt=system_prompt,
    )  # fmt: skip
    if texts is None or "info" not in texts:
        d["info"] = info
    if texts is not None:
        d["_json"] = texts
    return reply


@dataclass
class EnvSpec:
    """One environment as a server lists it."""

    __pydantic_config__ = _SCHEMA

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


# ---------------------------------------------------------------------------- requests


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


# ---------------------------------------------------------------------------- batch envelopes
# The JSON shapes of REST's replies (docs/wire.md), for the OpenAPI document; the
# functions below build and read them. gRPC's are the proto's messages of the same names.


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
    _envelope.__pydantic_config__ = _SCHEMA  # type: ignore[attr-defined]


Answer = SessionReply | _ErrorLike  # a batch item's answer: a reply or an error
Forks = list[SessionReply] | _ErrorLike  # a fork item's answer


def batch_item_json(result: Answer) -> dict[str, Any]:
    if isinstance(result, SessionReply):
        return {"ok": True, "reply": result.to_json()}
    return {"ok": False, "error": Error.of(result).to_json()}


def fork_item_json(result: Forks) -> dict[str, Any]:
    if isinstance(result, list):
        return {"ok": True, "replies": [r.to_json() for r in result]}
    return {"ok": False, "error": Error.of(result).to_json()}


def close_item_json(error: _ErrorLike | None) -> dict[str, Any]:
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


def close_to_proto(errors: Iterable[_ErrorLike | None]) -> pb.CloseResponse:
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


def frames_to_proto(results: Iterable[bytes | _ErrorLike]) -> pb.FrameResponse:
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
    for item in items:
        item.fill_proto(out.items.add())
    return out
