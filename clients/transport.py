"""One server, one transport: HTTP (httpx) or gRPC (grpc.aio).

A transport sends batch calls to one server and answers per item: a `SessionReply`
or the `VisenvError` of that item. A failure of the whole call raises: a `VisenvError`
for an answer from the server (bad token, body too large), `DeadlineExceeded` for a
timeout, and `ConnectionFailure` (internal; the client retries it) when no reply came.
"""

from __future__ import annotations

import asyncio
import json
from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import Any

import grpc
import httpx

from visenv.v1 import visenv_pb2 as pb
from visenv.v1 import visenv_pb2_grpc as pb_grpc

from .errors import ConnectionFailure, DeadlineExceeded, VisenvError, error_from_code
from .types import (
    ActionSpec,
    EnvSpec,
    Image,
    Observation,
    RewardParts,
    SessionOptions,
    SessionReply,
)

ItemResult = SessionReply | VisenvError
ForkResult = list[SessionReply] | VisenvError  # a fork item is answered whole

# gRPC status -> wire code, for whole-call errors that carry no visenv code of their own
_GRPC_TO_CODE = {
    grpc.StatusCode.INVALID_ARGUMENT: "INVALID_ARGUMENT",
    grpc.StatusCode.NOT_FOUND: "NOT_FOUND",
    grpc.StatusCode.DATA_LOSS: "SESSION_LOST",
    grpc.StatusCode.RESOURCE_EXHAUSTED: "CAPACITY",
    grpc.StatusCode.FAILED_PRECONDITION: "FAILED_PRECONDITION",
    grpc.StatusCode.UNAVAILABLE: "UNAVAILABLE",
    grpc.StatusCode.UNAUTHENTICATED: "UNAUTHENTICATED",
    grpc.StatusCode.PERMISSION_DENIED: "UNAUTHENTICATED",
    grpc.StatusCode.DEADLINE_EXCEEDED: "DEADLINE_EXCEEDED",
}
_HTTP_TO_CODE = {
    400: "INVALID_ARGUMENT",
    401: "UNAUTHENTICATED",
    403: "UNAUTHENTICATED",
    404: "NOT_FOUND",
    409: "FAILED_PRECONDITION",
    410: "SESSION_LOST",
    413: "PAYLOAD_TOO_LARGE",
    422: "INVALID_ARGUMENT",
    429: "CAPACITY",
    503: "UNAVAILABLE",
}
# trailing metadata key the visenv servicer sets on whole-call errors
CODE_METADATA_KEY = "visenv-code"
MAX_MESSAGE_BYTES = 256 * 1024 * 1024
GRPC_CHANNEL_OPTIONS = [
    ("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
    ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
    ("grpc.initial_reconnect_backoff_ms", 100),
    ("grpc.min_reconnect_backoff_ms", 100),
    ("grpc.max_reconnect_backoff_ms", 1000),
]


@dataclass(frozen=True)
class StepItem:
    session_id: str
    step_index: int
    response: str | None = None
    actions: tuple[ActionSpec, ...] | None = None


class Transport(ABC):
    """Batch calls to one server. `address` is how the client names that server."""

    def __init__(self, address: str, token: str | None, timeout: float) -> None:
        self.address = address
        self.token = token
        self.timeout = timeout

    @abstractmethod
    async def list_envs(self) -> list[EnvSpec]: ...

    @abstractmethod
    async def status(self) -> dict[str, Any]: ...

    @abstractmethod
    async def create(self, items: list[SessionOptions]) -> list[ItemResult]: ...

    @abstractmethod
    async def reset(self, items: list[tuple[str, int | None]]) -> list[ItemResult]: ...

    @abstractmethod
    async def step(self, items: list[StepItem]) -> list[ItemResult]: ...

    @abstractmethod
    async def get(self, session_ids: list[str]) -> list[ItemResult]: ...

    @abstractmethod
    async def close(self, session_ids: list[str]) -> list[VisenvError | None]: ...

    @abstractmethod
    async def fork(self, items: list[tuple[str, int]]) -> list[ForkResult]:
        """(session_id, n) items: each answers its n forks' replies, or one error."""

    @abstractmethod
    async def aclose(self) -> None: ...


# ---- HTTP ------------------------------------------------------------------------


class HttpTransport(Transport):
    """REST JSON over httpx (one pooled keep-alive client per server)."""

    def __init__(self, address: str, token: str | None, timeout: float) -> None:
        super().__init__(address, token, timeout)
        base = address if "://" in address else f"http://{address}"
        headers = {"authorization": f"Bearer {token}"} if token else {}
        self._http = httpx.AsyncClient(
            base_url=base,
            headers=headers,
            timeout=timeout,
            limits=httpx.Limits(max_connections=64, max_keepalive_connections=64),
        )

    async def _call(self, method: str, path: str, body: Any = None) -> Any:
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
        return resp.json()

    async def list_envs(self) -> list[EnvSpec]:
        data = await self._call("GET", "/v1/envs")
        return [EnvSpec.from_json(e) for e in data["envs"]]

    async def status(self) -> dict[str, Any]:
        return await self._call("GET", "/health")

    def _results(self, data: dict[str, Any]) -> list[ItemResult]:
        out: list[ItemResult] = []
        for item in data["results"]:
            if item.get("ok"):
                out.append(SessionReply.from_json(item["reply"], server=self.address))
            else:
                out.append(_json_error(item.get("error") or {}))
        return out

    async def create(self, items: list[SessionOptions]) -> list[ItemResult]:
        data = await self._call("POST", "/v1/batch/create", {"items": [o.to_json() for o in items]})
        return self._results(data)

    async def reset(self, items: list[tuple[str, int | None]]) -> list[ItemResult]:
        body = [
            {"session_id": sid} | ({"seed": seed} if seed is not None else {})
            for sid, seed in items
        ]
        return self._results(await self._call("POST", "/v1/batch/reset", {"items": body}))

    async def step(self, items: list[StepItem]) -> list[ItemResult]:
        body = []
        for it in items:
            entry: dict[str, Any] = {"session_id": it.session_id, "step_index": it.step_index}
            if it.actions is not None:
                entry["actions"] = [a.to_json() for a in it.actions]
            else:
                entry["response"] = it.response or ""
            body.append(entry)
        return self._results(await self._call("POST", "/v1/batch/step", {"items": body}))

    async def step_one(self, item: StepItem) -> ItemResult:
        """The single-session endpoint (used by the one-by-one benchmark)."""
        body: dict[str, Any] = {"step_index": item.step_index}
        if item.actions is not None:
            body["actions"] = [a.to_json() for a in item.actions]
        else:
            body["response"] = item.response or ""
        try:
            data = await self._call("POST", f"/v1/sessions/{item.session_id}/step", body)
        except VisenvError as exc:
            if isinstance(exc, DeadlineExceeded):
                raise
            return exc
        return SessionReply.from_json(data, server=self.address)

    async def get(self, session_ids: list[str]) -> list[ItemResult]:
        """REST has no batch get: one GET per session, all at once."""

        async def one(sid: str) -> ItemResult:
            try:
                data = await self._call("GET", f"/v1/sessions/{sid}")
            except VisenvError as exc:
                if isinstance(exc, DeadlineExceeded) or exc.code == "UNAUTHENTICATED":
                    raise
                return exc
            return SessionReply.from_json(data, server=self.address)

        return list(await asyncio.gather(*(one(sid) for sid in session_ids)))

    async def close(self, session_ids: list[str]) -> list[VisenvError | None]:
        data = await self._call("POST", "/v1/batch/close", {"session_ids": list(session_ids)})
        return [None if r.get("ok") else _json_error(r.get("error") or {}) for r in data["results"]]

    async def fork(self, items: list[tuple[str, int]]) -> list[ForkResult]:
        body = {"items": [{"session_id": sid, "n": n} for sid, n in items]}
        data = await self._call("POST", "/v1/batch/fork", body)
        return [
            [SessionReply.from_json(r, server=self.address) for r in item["replies"]]
            if item.get("ok")
            else _json_error(item.get("error") or {})
            for item in data["results"]
        ]

    async def aclose(self) -> None:
        await self._http.aclose()


def _json_error(err: dict[str, Any]) -> VisenvError:
    return error_from_code(
        str(err.get("code", "INTERNAL")), str(err.get("message", "")), err.get("field")
    )


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
        return _json_error(err)
    code = _HTTP_TO_CODE.get(resp.status_code, "INTERNAL")
    message = err if isinstance(err, str) else (resp.text[:500] or resp.reason_phrase)
    return error_from_code(code, f"HTTP {resp.status_code}: {message}")


# ---- gRPC ------------------------------------------------------------------------


class GrpcTransport(Transport):
    """The visenv.v1 gRPC service over one grpc.aio channel."""

    def __init__(self, address: str, token: str | None, timeout: float) -> None:
        super().__init__(address, token, timeout)
        target = address.split("://", 1)[1] if "://" in address else address
        self._channel = grpc.aio.insecure_channel(target, options=GRPC_CHANNEL_OPTIONS)
        self._stub = pb_grpc.VisenvStub(self._channel)
        self._metadata = (("authorization", f"Bearer {token}"),) if token else None

    async def _call(self, method: str, request: Any) -> Any:
        try:
            return await getattr(self._stub, method)(
                request, timeout=self.timeout, metadata=self._metadata
            )
        except grpc.aio.AioRpcError as exc:
            raise self._translate(exc) from exc

    def _translate(self, exc: grpc.aio.AioRpcError) -> Exception:
        trailing = dict(exc.trailing_metadata() or ())
        code = trailing.get(CODE_METADATA_KEY)
        if code is not None:  # an answer from the visenv servicer
            return error_from_code(str(code), exc.details() or "")
        status = exc.code()
        if status == grpc.StatusCode.DEADLINE_EXCEEDED:
            return DeadlineExceeded(f"{self.address}: no reply within {self.timeout}s")
        if status == grpc.StatusCode.UNAVAILABLE:
            return ConnectionFailure(f"{self.address}: {exc.details()}", sent=True)
        if status == grpc.StatusCode.RESOURCE_EXHAUSTED:  # grpc's own message size limit
            return error_from_code("PAYLOAD_TOO_LARGE", f"{self.address}: {exc.details()}")
        return error_from_code(
            _GRPC_TO_CODE.get(status, "INTERNAL"), f"{self.address}: {exc.details()}"
        )

    async def list_envs(self) -> list[EnvSpec]:
        resp = await self._call("ListEnvs", pb.ListEnvsRequest())
        return [
            EnvSpec(
                name=e.name,
                description=e.description,
                available=e.available,
                unavailable_reason=e.unavailable_reason or None,
                config_schema=json.loads(e.config_schema_json or "{}"),
                action_space=json.loads(e.action_space_json or "{}"),
                enabled=e.enabled,
            )
            for e in resp.envs
        ]

    async def status(self) -> dict[str, Any]:
        resp = await self._call("Status", pb.StatusRequest())
        return json.loads(resp.status_json or "{}")

    def _results(self, resp: pb.BatchResponse) -> list[ItemResult]:
        return [
            reply_from_proto(item.reply, self.address)
            if item.HasField("reply")
            else error_from_proto(item.error)
            for item in resp.results
        ]

    async def create(self, items: list[SessionOptions]) -> list[ItemResult]:
        req = pb.CreateRequest(items=[options_to_proto(o) for o in items])
        return self._results(await self._call("Create", req))

    async def reset(self, items: list[tuple[str, int | None]]) -> list[ItemResult]:
        req = pb.ResetRequest(
            items=[pb.ResetItem(session_id=sid, seed=seed) for sid, seed in items]
        )
        return self._results(await self._call("Reset", req))

    async def step(self, items: list[StepItem]) -> list[ItemResult]:
        req = pb.StepRequest()
        for it in items:
            msg = req.items.add(session_id=it.session_id, step_index=it.step_index)
            if it.actions is not None:
                msg.actions.SetInParent()
                for a in it.actions:
                    msg.actions.actions.add(name=a.name, args=list(a.args), payload=a.payload)
            else:
                msg.response = it.response or ""
        return self._results(await self._call("Step", req))

    async def get(self, session_ids: list[str]) -> list[ItemResult]:
        return self._results(await self._call("Get", pb.GetRequest(session_ids=session_ids)))

    async def close(self, session_ids: list[str]) -> list[VisenvError | None]:
        resp = await self._call("Close", pb.CloseRequest(session_ids=session_ids))
        return [None if r.ok else error_from_proto(r.error) for r in resp.results]

    async def fork(self, items: list[tuple[str, int]]) -> list[ForkResult]:
        req = pb.ForkRequest(items=[pb.ForkItem(session_id=sid, n=n) for sid, n in items])
        resp = await self._call("Fork", req)
        return [
            [reply_from_proto(r, self.address) for r in item.forks.replies]
            if item.HasField("forks")
            else error_from_proto(item.error)
            for item in resp.results
        ]

    async def aclose(self) -> None:
        await self._channel.close()


def options_to_proto(o: SessionOptions) -> pb.SessionOptions:
    return pb.SessionOptions(
        env=o.env,
        config_json=json.dumps(o.config) if o.config else "",
        seed=o.seed,
        format=o.format,
        representation=o.representation,
        reasoning_json=json.dumps(o.reasoning) if o.reasoning else "",
        image_encoding=o.image_encoding,
    )


def error_from_proto(err: pb.Error) -> VisenvError:
    return error_from_code(
        err.code or "INTERNAL", err.message, err.field if err.HasField("field") else None
    )


def reply_from_proto(r: pb.SessionReply, server: str = "") -> SessionReply:
    obs = r.observation
    parts = r.reward_parts
    return SessionReply(
        session_id=r.session_id,
        env=r.env,
        step_index=r.step_index,
        episode=r.episode,
        turn=r.turn,
        observation=Observation(
            text=obs.text,
            images=tuple(Image(im.encoding, im.data, tuple(im.shape)) for im in obs.images),
            ground_truth=json.loads(obs.ground_truth_json or "{}"),
            info=json.loads(obs.info_json or "{}"),
        ),
        reward=r.reward,
        reward_parts=RewardParts(
            parts.env, parts.format, parts.observation, parts.prediction, parts.penalty
        ),
        terminated=r.terminated,
        truncated=r.truncated,
        success=r.success,
        info=json.loads(r.info_json or "{}"),
        system_prompt=r.system_prompt,
        server=server,
    )


def make_transport(address: str, default: str, token: str | None, timeout: float) -> Transport:
    """A transport for `address`: "grpc://host:port", "http://host:port", or bare
    "host:port" with the `default` kind ("grpc" or "http")."""
    kind = default
    if "://" in address:
        scheme = address.split("://", 1)[0].lower()
        kind = "http" if scheme in ("http", "https") else "grpc" if scheme == "grpc" else ""
        if not kind:
            raise ValueError(
                f"unknown scheme in server address {address!r} (use http:// or grpc://)"
            )
    if kind == "http":
        return HttpTransport(address, token, timeout)
    if kind == "grpc":
        return GrpcTransport(address, token, timeout)
    raise ValueError(f"unknown transport {default!r}; use 'grpc' or 'http'")


__all__ = ["GrpcTransport", "HttpTransport", "StepItem", "Transport", "make_transport"]
