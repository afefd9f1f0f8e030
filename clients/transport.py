"""One server, one transport: HTTP (httpx) or gRPC (grpc.aio). Requests go as the
wire's conversions write them (`wire.to_json`, `wire.to_proto`: visenv/wire/convert.py).

A transport sends batch calls to one server and answers per item: a `SessionReply`
or the `VisenvError` of that item. A failure of the whole call raises: a `VisenvError`
for an answer from the server (bad token, body too large), `DeadlineExceeded` for a
timeout, and `ConnectionFailure` (internal; the client retries it) when no reply came.
"""

from __future__ import annotations

import asyncio
import json
from abc import ABC, abstractmethod
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import grpc
import httpx

from visenv import wire
from visenv.v1 import visenv_pb2 as pb
from visenv.wire import ForkItem, ResetItem, StepItem

from .errors import (
    ConnectionFailure,
    DeadlineExceeded,
    VisenvError,
    error_from_code,
    error_from_wire,
)
from .types import EnvSpec, SessionOptions, SessionReply

ItemResult = SessionReply | VisenvError
ForkResult = list[SessionReply] | VisenvError  # a fork item is answered whole


class Transport(ABC):
    """Batch calls to one server. `address` is how the client names that server.

    Replies are `reply_type`: the SDK's `SessionReply` (which carries `server`, the
    address), or the wire's own (a gateway passes them on as they came)."""

    def __init__(
        self,
        address: str,
        token: str | None,
        timeout: float,
        reply_type: type[wire.SessionReply] = SessionReply,
    ) -> None:
        self.address = address
        self.label = address  # how its own error messages name the server
        self.token = token
        self.timeout = timeout
        self.reply_type = reply_type
        # what each reply is made with besides the server's answer
        self.reply_extra = {"server": address} if issubclass(reply_type, SessionReply) else {}

    @abstractmethod
    async def list_envs(self) -> list[EnvSpec]: ...

    @abstractmethod
    async def status(self) -> dict[str, Any]: ...

    @abstractmethod
    async def create(self, items: list[SessionOptions]) -> list[ItemResult]: ...

    @abstractmethod
    async def reset(self, items: list[ResetItem]) -> list[ItemResult]: ...

    @abstractmethod
    async def step(self, items: list[StepItem]) -> list[ItemResult]: ...

    @abstractmethod
    async def get(self, session_ids: list[str]) -> list[ItemResult]: ...

    @abstractmethod
    async def close(self, session_ids: list[str]) -> list[VisenvError | None]: ...

    @abstractmethod
    async def frame(self, session_ids: list[str]) -> list[bytes | VisenvError]:
        """The PNG of the latest image each session showed, or its error."""

    @abstractmethod
    async def fork(self, items: list[ForkItem]) -> list[ForkResult]:
        """Each item answers its n forks' replies, or one error."""

    @abstractmethod
    async def aclose(self) -> None: ...


# ---- HTTP ------------------------------------------------------------------------


class HttpTransport(Transport):
    """REST JSON over httpx (one pooled keep-alive client per server)."""

    CONNECTIONS = 64  # per server

    def __init__(
        self,
        address: str,
        token: str | None,
        timeout: float,
        reply_type: type[wire.SessionReply] = SessionReply,
    ) -> None:
        super().__init__(address, token, timeout, reply_type)
        base = address if "://" in address else f"http://{address}"
        headers = {"authorization": f"Bearer {token}"} if token else {}
        self._http = httpx.AsyncClient(
            base_url=base,
            headers=headers,
            timeout=timeout,
            limits=httpx.Limits(max_connections=self.CONNECTIONS, max_keepalive_connections=64),
        )
        # many single-session requests at once (a REST get of many ids) queue here, not in
        # httpx's pool, whose wait counts against each request's timeout: 10,000 GETs at
        # once on a loaded machine timed out waiting for a connection (PoolTimeout)
        self._slots = asyncio.Semaphore(self.CONNECTIONS)

    async def _call(self, method: str, path: str, body: Any = None, raw: bool = False) -> Any:
        """The JSON answer of one request (its bytes with `raw`); errors raised typed."""
        try:
            resp = await self._http.request(method, path, json=body)
        except (httpx.ConnectError, httpx.ConnectTimeout) as exc:
            raise ConnectionFailure(f"{self.address}: cannot connect: {exc!r}", sent=False) from exc
        except httpx.TimeoutException as exc:
            raise DeadlineExceeded(
                f"{self.address}: no reply within {self.timeout}s ({type(exc).__name__})"
            ) from exc
        except (
            httpx.ReadError,
            httpx.WriteError,
            httpx.RemoteProtocolError,
            httpx.CloseError,
        ) as exc:
            raise ConnectionFailure(
                f"{self.address}: connection failed: {exc!r}", sent=True
            ) from exc
        if resp.status_code >= 400:
            raise _http_error(resp)
        return resp.content if raw else resp.json()

    async def list_envs(self) -> list[EnvSpec]:
        data = await self._call("GET", "/v1/envs")
        return [EnvSpec.from_json(e) for e in data["envs"]]

    async def status(self) -> dict[str, Any]:
        return await self._call("GET", "/health")

    def _results(self, data: dict[str, Any]) -> list[ItemResult]:
        return _typed(wire.batch_from_json(data, self.reply_type, **self.reply_extra))

    async def create(self, items: list[SessionOptions]) -> list[ItemResult]:
        body = {"items": [wire.to_json(o) for o in items]}
        return self._results(await self._call("POST", "/v1/batch/create", body))

    async def reset(self, items: list[ResetItem]) -> list[ItemResult]:
        body = {"items": [wire.to_json(it) for it in items]}
        return self._results(await self._call("POST", "/v1/batch/reset", body))

    async def step(self, items: list[StepItem]) -> list[ItemResult]:
        body = {"items": [wire.to_json(it) for it in items]}
        return self._results(await self._call("POST", "/v1/batch/step", body))

    async def get(self, session_ids: list[str]) -> list[ItemResult]:
        """REST has no batch get: one GET per session, all at once."""

        async def one(sid: str) -> ItemResult:
            try:
                async with self._slots:
                    data = await self._call("GET", f"/v1/sessions/{sid}")
            except VisenvError as exc:
                if isinstance(exc, DeadlineExceeded) or exc.code == "UNAUTHENTICATED":
                    raise
                return exc
            return self.reply_type.from_json(data, **self.reply_extra)

        return list(await asyncio.gather(*(one(sid) for sid in session_ids)))

    async def close(self, session_ids: list[str]) -> list[VisenvError | None]:
        data = await self._call("POST", "/v1/batch/close", {"session_ids": list(session_ids)})
        return _typed(wire.close_from_json(data))

    async def frame(self, session_ids: list[str]) -> list[bytes | VisenvError]:
        """One GET /v1/sessions/{id}/frame.png per session, all at once."""

        async def one(sid: str) -> bytes | VisenvError:
            try:
                return await self._call("GET", f"/v1/sessions/{sid}/frame.png", raw=True)
            except VisenvError as exc:
                if isinstance(exc, DeadlineExceeded) or exc.code == "UNAUTHENTICATED":
                    raise
                return exc

        return list(await asyncio.gather(*(one(sid) for sid in session_ids)))

    async def fork(self, items: list[ForkItem]) -> list[ForkResult]:
        body = {"items": [wire.to_json(it) for it in items]}
        data = await self._call("POST", "/v1/batch/fork", body)
        return _typed(wire.fork_from_json(data, self.reply_type, **self.reply_extra))

    async def aclose(self) -> None:
        await self._http.aclose()


def _typed(answers: list) -> list:
    """Answers with each wire `Error` as its typed exception."""
    return [error_from_wire(a) if isinstance(a, wire.Error) else a for a in answers]


def _http_error(resp: httpx.Response) -> VisenvError:
    """A whole-call HTTP error: the body's structured error when it has one."""
    try:
        body = resp.json()
    except ValueError:
        body = None
    err: Any = None
    if isinstance(body, dict):
        err = body.get("error", body.get("detail", body))
    if isinstance(err, dict) and "code" in err:
        return error_from_wire(wire.Error.from_json(err))
    code = wire.code_of_http(resp.status_code)
    message = err if isinstance(err, str) else (resp.text[:500] or resp.reason_phrase)
    return error_from_code(code, f"HTTP {resp.status_code}: {message}")


# ---- gRPC ------------------------------------------------------------------------


class GrpcTransport(Transport):
    """The visenv.v1 gRPC service over one grpc.aio channel; with `stream`, its small
    calls go over one `Calls` stream (`wire.Channel`)."""

    def __init__(
        self,
        address: str,
        token: str | None,
        timeout: float,
        stream: bool = True,
        reply_type: type[wire.SessionReply] = SessionReply,
    ) -> None:
        super().__init__(address, token, timeout, reply_type)
        target = address.split("://", 1)[1] if "://" in address else address
        self.rpc = wire.Channel(target, token, timeout, stream=stream)

    async def _call(self, method: str, request: Any) -> Any:
        try:
            return await self.rpc.call(method, request)
        except grpc.aio.AioRpcError as exc:
            raise self._translate(exc) from exc

    def _translate(self, exc: grpc.aio.AioRpcError) -> Exception:
        code = wire.rpc_error_code(exc)
        if code is not None:  # an answer from the visenv servicer
            return error_from_code(code, exc.details() or "")
        status = exc.code()
        if status == grpc.StatusCode.DEADLINE_EXCEEDED:
            return DeadlineExceeded(f"{self.label}: no reply within {self.timeout}s")
        if status == grpc.StatusCode.UNAVAILABLE:
            details = exc.details() or ""
            return ConnectionFailure(f"{self.label}: {details}", sent=not _not_connected(details))
        # e.g. a bare RESOURCE_EXHAUSTED: grpc's own message size limit
        return error_from_code(wire.code_of_grpc(status), f"{self.label}: {exc.details()}")

    async def list_envs(self) -> list[EnvSpec]:
        resp = await self._call("ListEnvs", pb.ListEnvsRequest())
        return [EnvSpec.from_proto(e) for e in resp.envs]

    async def status(self) -> dict[str, Any]:
        resp = await self._call("Status", pb.StatusRequest())
        return json.loads(resp.status_json or "{}")

    def _results(self, resp: pb.BatchResponse) -> list[ItemResult]:
        return _typed(wire.batch_from_proto(resp, self.reply_type, **self.reply_extra))

    async def create(self, items: list[SessionOptions]) -> list[ItemResult]:
        req = pb.CreateRequest(items=[wire.to_proto(o) for o in items])
        return self._results(await self._call("Create", req))

    async def reset(self, items: list[ResetItem]) -> list[ItemResult]:
        req = pb.ResetRequest(items=[wire.to_proto(it) for it in items])
        return self._results(await self._call("Reset", req))

    async def step(self, items: list[StepItem]) -> list[ItemResult]:
        return self._results(await self._call("Step", wire.step_request(items)))

    async def get(self, session_ids: list[str]) -> list[ItemResult]:
        return self._results(await self._call("Get", pb.GetRequest(session_ids=session_ids)))

    async def close(self, session_ids: list[str]) -> list[VisenvError | None]:
        resp = await self._call("Close", pb.CloseRequest(session_ids=session_ids))
        return _typed(wire.close_from_proto(resp))

    async def frame(self, session_ids: list[str]) -> list[bytes | VisenvError]:
        resp = await self._call("Frame", pb.FrameRequest(session_ids=session_ids))
        return _typed(wire.frames_from_proto(resp))

    async def fork(self, items: list[ForkItem]) -> list[ForkResult]:
        req = pb.ForkRequest(items=[wire.to_proto(it) for it in items])
        resp = await self._call("Fork", req)
        return _typed(wire.fork_from_proto(resp, self.reply_type, **self.reply_extra))

    async def aclose(self) -> None:
        await self.rpc.aclose()


# grpc's words for a connection that could not be made (refused, no route, no such name):
# such a call never reached the server, so even a create may be sent again
_NOT_CONNECTED = ("failed to connect", "connection refused", "dns resolution failed")


def _not_connected(details: str) -> bool:
    lowered = details.lower()
    return any(words in lowered for words in _NOT_CONNECTED)


# ---- splitting by the server's limits -------------------------------------------------

T = TypeVar("T")
Item = TypeVar("Item")


class SplittingTransport(Transport):
    """A transport whose batch calls are split into parts within the server's published
    limits (`max_batch_items`, `max_request_bytes`: its /health or Status `limits`, read
    once, at the first call of more than one item), sent concurrently (`PARALLEL` parts at
    a time), their answers put back in order. A call that fits goes as it is. If a part of
    a create fails whole, the sessions the other parts made are closed before it raises,
    so no session is left open that the caller never heard of."""

    PARALLEL = 4
    BYTES_SHARE = 0.8  # of max_request_bytes: room for the envelope the estimate misses

    def __init__(self, inner: Transport) -> None:
        super().__init__(inner.address, inner.token, inner.timeout, inner.reply_type)
        self.inner = inner
        self._limits: tuple[int, int] | None = None  # (items, bytes)
        self._parallel = asyncio.Semaphore(self.PARALLEL)

    async def _limits_now(self) -> tuple[int, int]:
        if self._limits is None:
            limits = (await self.inner.status()).get("limits") or {}
            items = int(limits.get("max_batch_items") or 4096)
            size = int(int(limits.get("max_request_bytes") or 8 << 20) * self.BYTES_SHARE)
            self._limits = (items, size)
        return self._limits

    async def _split(
        self,
        call: Callable[[list[Item]], Awaitable[list[T]]],
        items: list[Item],
    ) -> list[T]:
        if len(items) <= 1:
            return await call(items)
        most, budget = await self._limits_now()
        parts: list[list[Item]] = [[]]
        used = 0
        for item in items:
            size = len(repr(item))  # about its wire size (JSON or protobuf), cheaply
            if parts[-1] and (len(parts[-1]) >= most or used + size > budget):
                parts.append([])
                used = 0
            parts[-1].append(item)
            used += size
        if len(parts) == 1:
            return await call(items)

        async def one(part: list[Item]) -> list[T]:
            async with self._parallel:
                return await call(part)

        answers = await asyncio.gather(*(one(p) for p in parts), return_exceptions=True)
        failed = [a for a in answers if isinstance(a, BaseException)]
        if failed:
            if call == self.inner.create:  # close what the parts that succeeded made
                made = [r.session_id for a in answers if isinstance(a, list) for r in a
                        if isinstance(r, SessionReply)]  # fmt: skip
                await asyncio.gather(self.close(made), return_exceptions=True)
            raise failed[0]
        return [answer for part in answers for answer in part]  # type: ignore[union-attr]

    async def list_envs(self) -> list[EnvSpec]:
        return await self.inner.list_envs()

    async def status(self) -> dict[str, Any]:
        return await self.inner.status()

    async def create(self, items: list[SessionOptions]) -> list[ItemResult]:
        return await self._split(self.inner.create, items)

    async def reset(self, items: list[ResetItem]) -> list[ItemResult]:
        return await self._split(self.inner.reset, items)

    async def step(self, items: list[StepItem]) -> list[ItemResult]:
        return await self._split(self.inner.step, items)

    async def get(self, session_ids: list[str]) -> list[ItemResult]:
        return await self._split(self.inner.get, session_ids)

    async def close(self, session_ids: list[str]) -> list[VisenvError | None]:
        return await self._split(self.inner.close, session_ids)

    async def frame(self, session_ids: list[str]) -> list[bytes | VisenvError]:
        return await self._split(self.inner.frame, session_ids)

    async def fork(self, items: list[ForkItem]) -> list[ForkResult]:
        return await self._split(self.inner.fork, items)

    async def aclose(self) -> None:
        await self.inner.aclose()


def make_transport(
    address: str, default: str, token: str | None, timeout: float, grpc_stream: bool = True
) -> Transport:
    """A transport for `address`: "grpc://host:port", "http://host:port", or bare
    "host:port" with the `default` kind ("grpc" or "http"). `grpc_stream`: see
    `GrpcTransport`. Its batch calls split by the server's limits (`SplittingTransport`)."""
    kind = default
    if "://" in address:
        scheme = address.split("://", 1)[0].lower()
        kind = "http" if scheme in ("http", "https") else "grpc" if scheme == "grpc" else ""
        if not kind:
            raise ValueError(
                f"unknown scheme in server address {address!r} (use http:// or grpc://)"
            )
    if kind == "http":
        return SplittingTransport(HttpTransport(address, token, timeout))
    if kind == "grpc":
        return SplittingTransport(GrpcTransport(address, token, timeout, stream=grpc_stream))
    raise ValueError(f"unknown transport {default!r}; use 'grpc' or 'http'")


__all__ = [
    "ForkItem",
    "GrpcTransport",
    "HttpTransport",
    "ResetItem",
    "SplittingTransport",
    "StepItem",
    "Transport",
    "make_transport",
]
