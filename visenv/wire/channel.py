"""The client side of gRPC: the one place in visenv that opens a channel to a visenv gRPC
server (`open_channel`, with `CHANNEL_OPTIONS`), and `Channel`, the visenv.v1 service of
one server over it (the SDK's transport and the gateway's upstreams), which sends small
calls over one long-lived `Calls` stream (`_CallStream`, its client end)."""

from __future__ import annotations

import asyncio
import contextlib
import itertools
from collections.abc import Sequence
from typing import Any

import grpc

from visenv.v1 import visenv_pb2 as pb
from visenv.v1 import visenv_pb2_grpc as pb_grpc

from .errors import CODE_METADATA_KEY, GRPC_STATUS, rpc_error_code
from .stream import STREAMED

# a client's channel to a visenv gRPC server (the SDK's and the gateway's): big messages
# (raw images of a batch), and quick reconnects after a server restart; a server sends
# replies of up to the same MAX_MESSAGE_BYTES (env_server/api/grpc_server.py)
MAX_MESSAGE_BYTES = 256 * 1024 * 1024
CHANNEL_OPTIONS = [
    ("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
    ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
    ("grpc.initial_reconnect_backoff_ms", 100),
    ("grpc.min_reconnect_backoff_ms", 100),
    ("grpc.max_reconnect_backoff_ms", 1000),
]


def open_channel(
    target: str, *, sync: bool = False, options: Sequence[tuple[str, Any]] | None = None
) -> Any:
    """An insecure channel to the gRPC server at `target` ("host:port") with `options`
    (default `CHANNEL_OPTIONS`): a grpc.aio one, or with `sync` a blocking grpc one."""
    options = CHANNEL_OPTIONS if options is None else options
    if sync:
        return grpc.insecure_channel(target, options=options)
    return grpc.aio.insecure_channel(target, options=options)


# the calls a Channel sends over its `Calls` stream (`STREAMED`), when their request is
# at most STREAM_MAX_BYTES; a bigger call goes as a unary call of its own: its per-call
# cost is spread over many items, and a message over a server's size limit fails only
# that call (on the stream, it would end the stream, and every call in flight on it)
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
        self.channel = open_channel(target)
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
