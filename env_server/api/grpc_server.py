"""The gRPC servicer of visenv.v1: a thin adapter over a `SessionService`.

It parses each proto request item once, straight into the service's request model
(`service/models.py`, the same validation as REST's), and turns the replies back into
proto messages (with `visenv.wire`'s conversions); all session logic (validation,
routing, step indices, limits) is the service's. Per-item errors travel inside
`BatchResponse`; a failure of the whole call aborts with the matching gRPC status and the
wire code in the trailing metadata key `visenv-code`. The standard health service
(grpc.health.v1) and server reflection are served too; with a token, every call but
health needs `authorization: Bearer <token>`.

    server = build_grpc_server(service, "127.0.0.1:50051", token=None)
    await server.start()          # server.port is the bound port (useful with port 0)
"""

from __future__ import annotations

import asyncio
import functools
import hmac
import json
import logging
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from typing import Any, TypeVar

import grpc
from grpc_health.v1 import health, health_pb2_grpc
from grpc_reflection.v1alpha import reflection
from pydantic import BaseModel, ValidationError

from env_server.service.models import (
    ForkItem,
    ResetItem,
    ServiceError,
    SessionOptions,
    StepItem,
)
from env_server.service.protocol import SessionService
from env_server.service.settings import OFFLOAD_ITEMS, Settings
from visenv import wire
from visenv.v1 import visenv_pb2 as pb
from visenv.v1 import visenv_pb2_grpc as pb_grpc

log = logging.getLogger("visenv.grpc")

# calls that never need the token
OPEN_METHOD_PREFIXES = ("/grpc.health.v1.Health/",)
M = TypeVar("M", bound=BaseModel)


# ---- proto -> service requests ------------------------------------------------------


def _parsed(model: type[M], msg: Any) -> M:
    """The fields a proto message sets (read off its descriptor: `wire.fields_of`),
    validated once into the service's `model`."""
    try:
        return model.model_validate(wire.fields_of(msg))
    except wire.InvalidField as exc:  # a `*_json` field that is not a JSON object
        raise ServiceError("INVALID_ARGUMENT", str(exc), exc.field) from None
    except ValidationError as exc:
        raise ServiceError.from_validation(exc) from None


def options_item(o: pb.SessionOptions) -> SessionOptions:
    return _parsed(SessionOptions, o)


def reset_item(r: pb.ResetItem) -> ResetItem:
    return _parsed(ResetItem, r)


def step_item(s: pb.StepItem) -> StepItem:
    if s.WhichOneof("input") is None:
        raise ServiceError(
            "INVALID_ARGUMENT", "give exactly one of 'response' or 'actions'", "input"
        )
    return _parsed(StepItem, s)


def fork_item(f: pb.ForkItem) -> ForkItem:
    return _parsed(ForkItem, f)


async def _per_item(
    raw: Sequence[Any],
    parse: Callable[[Any], M],
    call: Callable[[list[M | ServiceError]], Awaitable[list[Any]]],
) -> list[Any]:
    """Parse each item and make one service call, answered in the original order. An item
    that fails to parse goes as its error, in its place: the service answers it as it is
    (counted, and held to the batch limit with the others, as any item it refuses)."""
    items: list[M | ServiceError] = []
    for item in raw:
        try:
            items.append(parse(item))
        except ServiceError as err:
            items.append(err)
    # (when the client goes away mid-call, grpc cancels this handler: the service still
    # records what its workers applied, its own calls being shielded where it matters)
    return await call(items)


async def _batch_reply(results: list[Any]) -> pb.BatchResponse:
    """The proto reply; a training-sized one is built off the event loop, so that other
    sessions' calls are answered meanwhile."""
    if len(results) <= OFFLOAD_ITEMS:
        return wire.batch_to_proto(results)
    return await asyncio.to_thread(wire.batch_to_proto, results)


# ---- the servicer ----------------------------------------------------------------------


async def _abort(context: grpc.aio.ServicerContext, code: str, message: str) -> None:
    await context.abort(
        wire.GRPC_STATUS.get(code, grpc.StatusCode.INTERNAL),
        message,
        trailing_metadata=((wire.CODE_METADATA_KEY, code),),
    )


def _call_error(servicer: VisenvServicer, exc: Exception, name: str) -> ServiceError:
    """The structured error a whole call's failure answers: its own ServiceError, or an
    INTERNAL one (a bug) under an error id that the logged traceback carries."""
    if isinstance(exc, ServiceError):
        return exc
    error = ServiceError.internal(exc, f"gRPC {name}", log)
    servicer.service.metrics.errors.labels("INTERNAL").inc()
    return error


class Undecodable:
    """A request protobuf could not parse (e.g. a string field whose bytes are not UTF-8):
    what the servicer gets instead of the message (`DecodeInterceptor`), and answers with
    INVALID_ARGUMENT rather than grpc's UNKNOWN."""

    def __init__(self, error: Exception) -> None:
        self.error = ServiceError(
            "INVALID_ARGUMENT", f"the request can't be parsed as its protobuf message: {error}"
        )


def _structured_errors(method: Callable[..., Awaitable[Any]]) -> Callable[..., Awaitable[Any]]:
    """A whole-call failure answers a structured error (wire code in the trailing
    metadata), never a bare UNKNOWN status. (`Calls` runs the undecorated method,
    `__wrapped__`, and answers the same error inside the stream.)"""

    @functools.wraps(method)
    async def wrapper(self: VisenvServicer, request: Any, context: grpc.aio.ServicerContext) -> Any:
        try:
            if isinstance(request, Undecodable):
                raise request.error
            return await method(self, request, context)
        except (grpc.aio.AbortError, asyncio.CancelledError):
            raise
        except Exception as exc:
            error = _call_error(self, exc, method.__name__)
            await _abort(context, error.code, error.message)

    return wrapper


# calls one `Calls` stream may have in flight; past it, its next request is read when one
# is answered (grpc's flow control then holds the client back), as grpc's cap on streams
# per connection (100) bounds unary calls
STREAM_MAX_CALLS = 128


class _ServedStream:
    """The server end of one `Calls` stream (the client end is visenv.wire.channel's
    `_CallStream`; both read the method table of visenv.wire.stream): its calls in flight
    (a task each) and the answers waiting to be written; None in `answers` ends the stream
    (no more requests, and every call answered)."""

    def __init__(self) -> None:
        self.answers: asyncio.Queue[pb.CallResponse | None] = asyncio.Queue()
        self.room = asyncio.Semaphore(STREAM_MAX_CALLS)
        self.running: set[asyncio.Task] = set()
        self.reader: asyncio.Task | None = None
        self.reading = True
        self._ended = False

    def start(self, answer: Awaitable[pb.CallResponse]) -> None:
        task = asyncio.ensure_future(answer)
        self.running.add(task)
        task.add_done_callback(self._answered)

    def _answered(self, task: asyncio.Task) -> None:
        self.running.discard(task)
        self.room.release()
        if not task.cancelled():
            self.answers.put_nowait(task.result())
        self.end_if_idle()

    def end_if_idle(self) -> None:
        if not self.reading and not self.running and not self._ended:
            self._ended = True
            self.answers.put_nowait(None)


class VisenvServicer(pb_grpc.VisenvServicer):
    def __init__(self, service: SessionService) -> None:
        self.service = service
        self._streams: set[_ServedStream] = set()

    @_structured_errors
    async def ListEnvs(
        self, request: pb.ListEnvsRequest, context: grpc.aio.ServicerContext
    ) -> pb.ListEnvsResponse:
        specs = await self.service.list_envs()
        limits = self.service.limits()
        return pb.ListEnvsResponse(
            envs=[spec.to_proto() for spec in specs], limits_json=json.dumps(limits)
        )

    @_structured_errors
    async def Create(
        self, request: pb.CreateRequest, context: grpc.aio.ServicerContext
    ) -> pb.BatchResponse:
        return await _batch_reply(await _per_item(request.items, options_item, self.service.create))

    @_structured_errors
    async def Reset(
        self, request: pb.ResetRequest, context: grpc.aio.ServicerContext
    ) -> pb.BatchResponse:
        return await _batch_reply(await _per_item(request.items, reset_item, self.service.reset))

    @_structured_errors
    async def Step(
        self, request: pb.StepRequest, context: grpc.aio.ServicerContext
    ) -> pb.BatchResponse:
        return await _batch_reply(await _per_item(request.items, step_item, self.service.step))

    @_structured_errors
    async def Get(
        self, request: pb.GetRequest, context: grpc.aio.ServicerContext
    ) -> pb.BatchResponse:
        return wire.batch_to_proto(await self.service.get(list(request.session_ids)))

    @_structured_errors
    async def Close(
        self, request: pb.CloseRequest, context: grpc.aio.ServicerContext
    ) -> pb.CloseResponse:
        errors = await self.service.close(list(request.session_ids))
        return wire.close_to_proto(errors)

    @_structured_errors
    async def Fork(
        self, request: pb.ForkRequest, context: grpc.aio.ServicerContext
    ) -> pb.ForkResponse:
        return wire.fork_to_proto(await _per_item(request.items, fork_item, self.service.fork))

    @_structured_errors
    async def Status(
        self, request: pb.StatusRequest, context: grpc.aio.ServicerContext
    ) -> pb.StatusResponse:
        return pb.StatusResponse(status_json=json.dumps(await self.service.health()))

    @_structured_errors
    async def Frame(
        self, request: pb.FrameRequest, context: grpc.aio.ServicerContext
    ) -> pb.FrameResponse:
        async def one(session_id: str) -> bytes | ServiceError:
            try:
                return await self.service.frame(session_id)
            except ServiceError as error:
                return error

        ids = list(request.session_ids)
        return wire.frames_to_proto(await asyncio.gather(*(one(sid) for sid in ids)))

    async def Calls(
        self, requests: AsyncIterator[pb.CallRequest], context: grpc.aio.ServicerContext
    ) -> AsyncIterator[pb.CallResponse]:
        """Many calls over one stream: each request runs as a task of its own, through
        the same method as its unary call, and is answered (with its id) when it finishes.
        The stream ends when the client has sent its last request and every call is
        answered, or when the server stops (`end_streams`)."""
        stream = _ServedStream()
        self._streams.add(stream)

        undecodable: list[Undecodable] = []

        async def read() -> None:
            try:
                async for request in requests:
                    if isinstance(request, Undecodable):  # the stream ends with its error
                        undecodable.append(request)
                        break
                    await stream.room.acquire()
                    stream.start(self._answer(request, context))
            finally:
                stream.reading = False
                stream.end_if_idle()

        stream.reader = asyncio.create_task(read())
        try:
            while (answer := await stream.answers.get()) is not None:
                yield answer
        finally:
            self._streams.discard(stream)
            stream.reader.cancel()
        if undecodable:
            await _abort(context, "INVALID_ARGUMENT", undecodable[0].error.message)

    async def _answer(
        self, request: pb.CallRequest, context: grpc.aio.ServicerContext
    ) -> pb.CallResponse:
        """One call of a stream: its reply, or its whole-call error, under its id."""
        kind = request.WhichOneof("call")
        calls = wire.STREAMED_CALLS  # call field -> (the unary method, reply field)
        try:
            if kind is None:
                raise ServiceError(
                    "INVALID_ARGUMENT",
                    f"CallRequest {request.id} carries no call: set one of {', '.join(calls)}",
                    "call",
                )
            method, field = calls[kind]
            unary = getattr(type(self), method).__wrapped__
            reply = await unary(self, getattr(request, kind), context)
            return pb.CallResponse(id=request.id, **{field: reply})
        except Exception as exc:  # answered in the stream, which goes on
            error = _call_error(self, exc, calls.get(kind or "", ("Calls",))[0])
            return pb.CallResponse(id=request.id, error=wire.Error.of(error).to_proto())

    def end_streams(self) -> None:
        """The server is stopping: every `Calls` stream stops taking requests and ends
        once the calls it has in flight are answered (an idle one at once), so that
        clients holding streams open don't hold up the stop for its whole grace."""
        for stream in list(self._streams):
            if stream.reader is not None:
                stream.reader.cancel()


def _handler(handler: Any, behaviour: Callable | None, deserializer: Callable) -> Any:
    """`handler` (grpc's RpcMethodHandler) with `behaviour` (None: its own) and
    `deserializer` in place of its own."""
    kw = {"request_deserializer": deserializer, "response_serializer": handler.response_serializer}
    for kind, make in (
        ("unary_unary", grpc.unary_unary_rpc_method_handler),
        ("unary_stream", grpc.unary_stream_rpc_method_handler),
        ("stream_unary", grpc.stream_unary_rpc_method_handler),
        ("stream_stream", grpc.stream_stream_rpc_method_handler),
    ):
        if getattr(handler, kind):
            return make(behaviour or getattr(handler, kind), **kw)
    return handler


class DecodeInterceptor(grpc.aio.ServerInterceptor):
    """Visenv's requests that protobuf can't parse reach the servicer as `Undecodable`
    (answered INVALID_ARGUMENT), instead of failing in grpc with UNKNOWN."""

    async def intercept_service(self, continuation, handler_call_details):
        handler = await continuation(handler_call_details)
        if handler is None or not handler_call_details.method.startswith("/visenv.v1.Visenv/"):
            return handler
        parse = handler.request_deserializer

        def lenient(data: bytes) -> Any:
            try:
                return parse(data)
            except Exception as exc:  # protobuf's DecodeError (of either implementation)
                return Undecodable(exc)

        return _handler(handler, None, lenient)


class TokenInterceptor(grpc.aio.ServerInterceptor):
    """Refuses every call without `authorization: Bearer <token>`, except health; the
    scheme is case-insensitive (RFC 7235), as on REST and the WebSocket."""

    def __init__(self, token: str) -> None:
        self._expected = token.encode()

    def _authorized(self, details: grpc.HandlerCallDetails) -> bool:
        if details.method.startswith(OPEN_METHOD_PREFIXES):
            return True
        for key, value in details.invocation_metadata or ():
            if key == "authorization":
                given = value.encode() if isinstance(value, str) else value
                scheme, _, credential = given.partition(b" ")
                return scheme.lower() == b"bearer" and hmac.compare_digest(
                    credential.strip(), self._expected
                )
        return False

    async def intercept_service(self, continuation, handler_call_details):
        handler = await continuation(handler_call_details)
        if handler is None or self._authorized(handler_call_details):
            return handler
        message = "missing or wrong bearer token: send the metadata 'authorization: Bearer <token>'"

        async def deny_unary(request: Any, context: grpc.aio.ServicerContext) -> None:
            await _abort(context, "UNAUTHENTICATED", message)

        async def deny_stream(request_iterator: Any, context: grpc.aio.ServicerContext) -> None:
            await _abort(context, "UNAUTHENTICATED", message)

        deny = deny_stream if handler.stream_unary or handler.stream_stream else deny_unary
        return _handler(handler, deny, handler.request_deserializer)


def build_grpc_server(
    service: SessionService,
    address: str,
    token: str | None,
    max_request_bytes: int | None = None,
    options: Sequence[tuple[str, Any]] = (),
) -> grpc.aio.Server:
    """A grpc.aio server (not started) serving visenv.v1, health and reflection on
    `address` ("host:port"; port 0 picks a free one, found afterwards in `server.port`).
    Requests are capped at `max_request_bytes`, the same limit as REST's bodies (default:
    `Settings.max_request_bytes`); a server and a gateway each pass their own. `options`:
    more grpc server options (app.serve's connection limits)."""
    receive = max_request_bytes or Settings().max_request_bytes
    server = grpc.aio.server(
        interceptors=[DecodeInterceptor(), *([TokenInterceptor(token)] if token else [])],
        options=[
            ("grpc.max_send_message_length", wire.MAX_MESSAGE_BYTES),  # replies: big batches
            ("grpc.max_receive_message_length", receive),
            ("grpc.so_reuseport", 0),
            *options,
        ],
    )
    server.visenv = VisenvServicer(service)  # type: ignore[attr-defined]
    pb_grpc.add_VisenvServicer_to_server(server.visenv, server)  # type: ignore[attr-defined]
    # overall health ("") answers SERVING while the server runs; `visenv.env.<name>` says
    # whether an environment is ready (warmed up), kept in step by app.serve
    server.health = health.aio.HealthServicer()  # type: ignore[attr-defined]
    health_pb2_grpc.add_HealthServicer_to_server(server.health, server)  # type: ignore[attr-defined]
    service_name = pb.DESCRIPTOR.services_by_name["Visenv"].full_name
    reflection.enable_server_reflection(
        (service_name, health.SERVICE_NAME, reflection.SERVICE_NAME), server
    )
    server.port = server.add_insecure_port(address)  # type: ignore[attr-defined]
    return server
