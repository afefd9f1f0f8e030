"""The REST API: a thin FastAPI adapter over a `SessionService` (endpoints of docs/wire.md).

    app = build_app(service, token=None, max_request_bytes=8 << 20)

Errors answer `{"error": {"code", "message", "field"}}` with the HTTP status of
docs/wire.md; request validation errors (including malformed JSON) are 422 naming
the field; bodies over the limit are 413; a missing or wrong bearer token is 401
(every route but /health and the public pages needs it when a token is set: `/`, which
leads to /play, the play page and /docs are pages a browser opens without a header; the
play page asks for the token and sends it with each API call). The bearer scheme is
case-insensitive (RFC 7235), as on gRPC and the WebSocket; a 405 carries `Allow`.
"""

from __future__ import annotations

import asyncio
import hmac
import json
import logging
from pathlib import Path
from typing import Any

import pydantic_core
from fastapi import Body, FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import FileResponse, JSONResponse, RedirectResponse, Response
from fastapi.routing import APIRoute
from fastapi.staticfiles import StaticFiles
from fastapi_offline import FastAPIOffline
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from env_server.service.models import (
    BatchClose,
    BatchCreate,
    BatchFork,
    BatchReset,
    BatchStep,
    ForkBody,
    ResetBody,
    ServiceError,
    SessionOptions,
    StepBody,
)
from env_server.service.protocol import SessionService
from env_server.service.settings import OFFLOAD_ITEMS
from visenv import wire

from .compat.common import PREFIX as COMPAT_PREFIX
from .compat.common import SafeJSONResponse, json_bytes, presented_token
from .connections import replayed
from .lean import LeanStepMiddleware

log = logging.getLogger("visenv.rest")
STATIC = Path(__file__).parent / "static"
# the OpenAPI document's reply schemas are generated from the wire types (visenv.wire)
ERRORS = {
    status: {"model": wire.ErrorReply}
    for status in sorted({c.http_status for c in wire.ERROR_CODES.values() if not c.client_only})
}


def replies(model: Any) -> dict[str, Any]:
    """A route's documented replies: `model` (a wire type) on 200, else an ErrorReply."""
    return {"response_model": None, "responses": {200: {"model": model}, **ERRORS}}


OFFLOAD_BODY_BYTES = 64 * 1024  # JSON bodies longer than this are parsed in a thread


def parse_json_body(body: bytes) -> Any:
    """A request's JSON, by pydantic-core's parser: in a thread, it lets the event loop run
    meanwhile, where json.loads holds the GIL throughout (a 6 MB batch/step body: the
    loop's worst pause 13-18 ms against 47-49 ms). Where it refuses, json.loads decides:
    it takes what pydantic-core refuses but Python reads (a lone surrogate escape, which
    validation then names), and its error is the one FastAPI answers 422 with."""
    try:
        return pydantic_core.from_json(body)
    except ValueError:
        return json.loads(body)


class OffloadRequest(Request):
    """A request whose JSON body, when large, is parsed off the event loop."""

    async def json(self) -> Any:
        if not hasattr(self, "_json"):
            body = await self.body()
            if len(body) <= OFFLOAD_BODY_BYTES:
                self._json = json.loads(body)
            else:
                self._json = await asyncio.to_thread(parse_json_body, body)
        return self._json


class OffloadRoute(APIRoute):
    """Every route of the app reads its body through `OffloadRequest`."""

    def get_route_handler(self) -> Any:
        handler = super().get_route_handler()

        async def route(request: Request) -> Response:
            return await handler(OffloadRequest(request.scope, request.receive))

        return route


ONE = replies(wire.SessionReply)
BATCH = replies(wire.BatchResponse)
# /docs loads Swagger UI from /static-offline-docs (fastapi-offline's files, no CDN)
OPEN_PATHS = ("/health", "/play", "/static/", "/docs", "/static-offline-docs/", "/openapi.json",
              "/favicon.ico")  # fmt: skip


def error_response(error: ServiceError) -> JSONResponse:
    return SafeJSONResponse({"error": error.to_json()}, status_code=error.http_status)


def one(result: Any) -> Response:
    """A single-session route's response: the reply, or the error it got."""
    if isinstance(result, ServiceError):
        return error_response(result)
    return SafeJSONResponse(result.to_json())


async def batch(results: list) -> Response:
    """A batch route's response: each item's reply or error, in order."""
    if len(results) <= OFFLOAD_ITEMS:
        return SafeJSONResponse({"results": [wire.batch_item_json(r) for r in results]})

    # a training-sized reply (tens of MB of JSON) is written off the event loop, item by
    # item (one json.dumps call over all of it would hold the GIL throughout), so that
    # other sessions' calls are answered meanwhile
    def render() -> bytes:
        items = (json_bytes(wire.batch_item_json(r)) for r in results)
        return b'{"results":[' + b",".join(items) + b"]}"

    return Response(await asyncio.to_thread(render), media_type="application/json")


class TokenSizeMiddleware:
    """Pure ASGI middleware: bearer-token check and request-body size limit.

    The body is read here (counting bytes whatever Content-Length claims) and replayed
    to the app, so an oversized body is refused with 413 before anything parses it.
    WebSocket handshakes are checked too (refused with 401). The peers' adapters under
    /compat/ also take the token as `X-API-Key` or `?token=` (VAGEN's client, browsers'
    WebSockets), get their bodies' content types untouched (multipart), and their
    `.../health` is open; `open_prefixes` are served without a token (the VAGEN legacy
    adapter, whose client sends none, when the operator enables it).
    """

    def __init__(
        self,
        app: ASGIApp,
        token: str | None,
        max_bytes: int,
        open_prefixes: tuple[str, ...] = (),
    ) -> None:
        self.app = app
        self.token = token.encode() if token else None
        self.max_bytes = max_bytes
        self.open_prefixes = open_prefixes

    def _is_open(self, path: str) -> bool:
        if path == "/" or path.startswith(OPEN_PATHS + self.open_prefixes):  # `/`: to /play
            return True
        return path.startswith(COMPAT_PREFIX) and path.endswith("/health")

    def _authorized(self, scope: Scope, headers: dict[bytes, bytes]) -> bool:
        assert self.token is not None
        if scope["path"].startswith(COMPAT_PREFIX):
            given = presented_token(headers, scope.get("query_string", b""))
        else:
            scheme, _, bearer = headers.get(b"authorization", b"").partition(b" ")
            given = bearer.strip() if scheme.lower() == b"bearer" else None
        return given is not None and hmac.compare_digest(given, self.token)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] not in ("http", "websocket"):
            return await self.app(scope, receive, send)
        headers = dict(scope["headers"])
        compat = scope["path"].startswith(COMPAT_PREFIX)
        if self.token is not None and not self._is_open(scope["path"]):
            if not self._authorized(scope, headers):
                error = ServiceError(
                    "UNAUTHENTICATED",
                    "this server needs 'Authorization: Bearer <token>'"
                    + (" (or 'X-API-Key: <token>', or ?token=<token>)" if compat else ""),
                )
                if scope["type"] == "websocket":
                    return await _refuse_websocket(scope, receive, send, error)
                return await error_response(error)(scope, receive, send)
        if scope["type"] == "websocket":
            return await self.app(scope, receive, send)
        too_large = ServiceError(
            "PAYLOAD_TOO_LARGE", f"request body over the limit of {self.max_bytes} bytes"
        )
        length = headers.get(b"content-length")
        if length is not None and length.isdigit() and int(length) > self.max_bytes:
            return await error_response(too_large)(scope, receive, send)
        if scope["method"] not in ("POST", "PUT", "PATCH", "DELETE"):
            return await self.app(scope, receive, send)
        chunks: list[bytes] = []
        size = 0
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                return
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > self.max_bytes:
                return await error_response(too_large)(scope, receive, send)
            chunks.append(chunk)
            if not message.get("more_body", False):
                break
        body = b"".join(chunks)
        if not compat and b"json" not in headers.get(b"content-type", b""):  # `curl -d '{..}'`
            scope = dict(scope)
            scope["headers"] = [(k, v) for k, v in scope["headers"] if k != b"content-type"]
            scope["headers"].append((b"content-type", b"application/json"))
        whole = {"type": "http.request", "body": body, "more_body": False}
        await self.app(scope, replayed(whole, receive), send)


class StartedMiddleware:
    """Pure ASGI middleware: the server listens before its service has started (workers
    importing their environments); a request other than a health check (/health, the
    adapters' .../health), /metrics and the static pages waits for the start (UNAVAILABLE
    if it failed), so every route, the peers' adapters included, sees a started service."""

    WITHOUT = ("/health", "/metrics", "/play", "/static/", "/docs", "/openapi.json", "/favicon.ico")

    def __init__(self, app: ASGIApp, service: SessionService) -> None:
        self.app = app
        self.wait = service.wait_started

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] in ("http", "websocket"):
            path = scope["path"]
            if not path.startswith(self.WITHOUT) and path != "/" and not path.endswith("/health"):
                try:
                    await self.wait()
                except ServiceError as error:
                    if scope["type"] == "websocket":
                        return await _refuse_websocket(scope, receive, send, error)
                    return await error_response(error)(scope, receive, send)
        await self.app(scope, receive, send)


class InternalErrorMiddleware:
    """Pure ASGI middleware, outermost: an unexpected exception anywhere in the app (a bug,
    e.g. a reply that can't be encoded) answers a structured INTERNAL error with an id that
    the logged traceback carries, and is counted in visenv_errors_total{code="INTERNAL"}."""

    def __init__(self, app: ASGIApp, metrics: Any) -> None:
        self.app = app
        self.metrics = metrics

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        started = False

        async def tracked(message: Message) -> None:
            nonlocal started
            started = started or message["type"] == "http.response.start"
            await send(message)

        try:
            await self.app(scope, receive, tracked)
        except Exception as exc:
            where = f"{scope.get('method', '')} {scope.get('path', '')}"
            error = ServiceError.internal(exc, where, log)
            self.metrics.errors.labels("INTERNAL").inc()
            if not started:  # otherwise the client sees a cut-off reply; the log has the id
                await error_response(error)(scope, receive, send)


async def _refuse_websocket(
    scope: Scope, receive: Receive, send: Send, error: ServiceError
) -> None:
    """Refuse a WebSocket handshake: HTTP 401 with the error body where the server can send
    one (the ASGI websocket.http.response extension), else close with policy violation."""
    await receive()  # websocket.connect
    if "websocket.http.response" in scope.get("extensions", {}):
        body = json.dumps({"error": error.to_json()}).encode()
        await send(
            {
                "type": "websocket.http.response.start",
                "status": error.http_status,
                "headers": [(b"content-type", b"application/json")],
            }
        )
        await send({"type": "websocket.http.response.body", "body": body})
    else:
        await send({"type": "websocket.close", "code": 1008, "reason": error.message[:120]})


def _validation_error(exc: RequestValidationError) -> ServiceError:
    err = exc.errors()[0]
    loc = [str(p) for p in err.get("loc", ()) if p not in ("body", "path", "query")]
    if err.get("type") == "json_invalid":
        return ServiceError("INVALID_ARGUMENT", f"malformed JSON body: {err.get('msg')}", None)
    field = ".".join(loc) or None
    return ServiceError("INVALID_ARGUMENT", f"{field or 'body'}: {err.get('msg')}", field)


def build_app(
    service: SessionService,
    token: str | None = None,
    max_request_bytes: int = 8 << 20,
    open_prefixes: tuple[str, ...] = (),
) -> FastAPI:
    """The FastAPI app over a started `service` (the caller starts and stops it)."""
    app = FastAPIOffline(  # a FastAPI app whose /docs works without internet
        redoc_url=None,  # ReDoc would still fetch its logo from a CDN
        default_response_class=SafeJSONResponse,
        title="visenv",
        version="0.1.0",
        description="Visual environments for multi-turn RL of vision-language agents. "
        "Wire shapes: docs/wire.md. Play by hand at /play.",
    )
    app.router.route_class = OffloadRoute  # large JSON bodies parsed off the event loop
    # the steps without FastAPI's routing (their errors: the routes', below)
    app.add_middleware(
        LeanStepMiddleware, service=service, one=one, batch=batch, max_bytes=OFFLOAD_BODY_BYTES
    )
    app.add_middleware(
        TokenSizeMiddleware, token=token, max_bytes=max_request_bytes, open_prefixes=open_prefixes
    )
    app.add_middleware(StartedMiddleware, service=service)
    app.add_middleware(InternalErrorMiddleware, metrics=service.metrics)  # the outermost
    app.mount("/static", StaticFiles(directory=STATIC), name="static")

    @app.exception_handler(RequestValidationError)
    async def _on_validation(_: Request, exc: RequestValidationError) -> JSONResponse:
        return error_response(_validation_error(exc))

    @app.exception_handler(ServiceError)
    async def _on_service_error(_: Request, exc: ServiceError) -> JSONResponse:
        return error_response(exc)  # a whole call refused (e.g. over max_batch_items)

    @app.exception_handler(StarletteHTTPException)
    async def _on_http(_: Request, exc: StarletteHTTPException) -> JSONResponse:
        if exc.status_code == 400:  # e.g. a body that is not UTF-8: the wire's 422
            return error_response(
                ServiceError("INVALID_ARGUMENT", f"malformed request body: {exc.detail}")
            )
        fallback = "INTERNAL" if exc.status_code >= 500 else "INVALID_ARGUMENT"
        code = wire.code_of_http(exc.status_code, fallback)
        return SafeJSONResponse(  # (a 405's Allow header kept)
            {"error": wire.Error(code, str(exc.detail)).to_json()},
            status_code=exc.status_code,
            headers=exc.headers,
        )

    @app.get("/health", tags=["server"])
    async def health() -> dict[str, Any]:
        """Liveness and load: status, open sessions and the cap, enabled envs, workers.
        Open without a token."""
        return await service.health()

    @app.get("/metrics", tags=["server"])
    async def metrics() -> Response:
        """Prometheus metrics: requests, latencies, sessions, errors by code."""
        return Response(service.metrics.render(), media_type="text/plain; version=0.0.4")

    @app.get("/play", include_in_schema=False)
    async def play() -> FileResponse:
        return FileResponse(STATIC / "play.html")

    @app.get("/favicon.ico", include_in_schema=False)
    async def favicon() -> FileResponse:
        return FileResponse(STATIC / "favicon.svg", media_type="image/svg+xml")

    @app.get("/", include_in_schema=False)
    async def root() -> RedirectResponse:
        return RedirectResponse("/play")

    @app.get("/v1/envs", tags=["envs"], **replies(wire.ListEnvsResponse))
    async def list_envs() -> JSONResponse:
        """Every registered environment: its config schema, action space, and whether
        it is enabled and available on this server; and the server's limits."""
        envs = [spec.to_json() for spec in await service.list_envs()]
        return SafeJSONResponse({"envs": envs, "limits": await limits()})

    @app.get("/v1/limits", tags=["envs"])
    async def limits() -> dict[str, Any]:
        """The limits every request is held to, the same on every transport: request
        bytes, items per batch call, actions per step, sessions, and the seed rule."""
        # a gateway's: its upstreams' (the strictest of each)
        return service.limits()

    @app.post("/v1/sessions", tags=["sessions"], summary="Create a session (and reset it)", **ONE)
    async def create(options: SessionOptions) -> Response:
        """Create a session of an environment and reset it to `seed`: the first
        observation, the system prompt, step_index 0."""
        return one((await service.create([options]))[0])

    @app.get("/v1/sessions/{session_id}", tags=["sessions"], summary="The last reply", **ONE)
    async def get(session_id: str) -> Response:
        """The session's last reply again (applies nothing)."""
        return one((await service.get([session_id]))[0])

    @app.post("/v1/sessions/{session_id}/reset", tags=["sessions"], **ONE)
    async def reset(session_id: str, body: ResetBody | None = Body(None)) -> Response:
        """Start a new episode in the session: at `seed`, or at the previous seed + 1
        when none is given."""
        return one((await service.reset([(body or ResetBody()).item(session_id)]))[0])

    @app.post("/v1/sessions/{session_id}/step", tags=["sessions"], **ONE)
    async def step(session_id: str, body: StepBody) -> Response:
        """Take one turn: the agent's raw response (parsed and graded) or explicit
        actions. `step_index` must be the reply's; a repeated index is answered from
        memory, never applied twice."""
        return one((await service.step([body.item(session_id)]))[0])

    @app.post(
        "/v1/sessions/{session_id}/fork",
        tags=["sessions"],
        summary="Fork a session: n new sessions in its exact state",
        **replies(wire.ForkedSessions),
    )
    async def fork(session_id: str, body: ForkBody | None = Body(None)) -> Response:
        """Make `n` new sessions in this session's exact state (group rollouts,
        branches)."""
        result = (await service.fork([(body or ForkBody()).item(session_id)]))[0]
        if isinstance(result, ServiceError):
            return error_response(result)
        return SafeJSONResponse({"replies": [r.to_json() for r in result]})

    @app.delete("/v1/sessions/{session_id}", tags=["sessions"])
    async def close(session_id: str) -> Response:
        """Close the session and free its environment."""
        error = (await service.close([session_id]))[0]
        return error_response(error) if error is not None else SafeJSONResponse({"ok": True})

    @app.get(
        "/v1/sessions/{session_id}/frame.png",
        tags=["sessions"],
        response_class=Response,
        responses={200: {"content": {"image/png": {}}}},
    )
    async def frame(session_id: str) -> Response:
        """The latest image the session showed, as PNG (svg: the agent's rendering
        after a step; after a text-only turn, the image before it)."""
        try:
            png = await service.frame(session_id)
        except ServiceError as error:
            return error_response(error)
        return Response(png, media_type="image/png")

    @app.post("/v1/batch/create", tags=["batch"], **BATCH)
    async def batch_create(body: BatchCreate) -> JSONResponse:
        """Create many sessions; each item is answered on its own (one bad item gets
        its own error)."""
        return await batch(await service.create(body.items))

    @app.post("/v1/batch/reset", tags=["batch"], **BATCH)
    async def batch_reset(body: BatchReset) -> JSONResponse:
        """Reset many sessions; each item is answered on its own."""
        return await batch(await service.reset(body.items))

    @app.post("/v1/batch/step", tags=["batch"], **BATCH)
    async def batch_step(body: BatchStep) -> JSONResponse:
        """Step many sessions at once (one message per worker); each item is answered
        on its own."""
        return await batch(await service.step(body.items))

    @app.post(
        "/v1/batch/fork",
        tags=["batch"],
        **replies(wire.ForkResponse),
    )
    async def batch_fork(body: BatchFork) -> JSONResponse:
        """Fork many sessions; each item gets its forks or its own error."""
        results = await service.fork(body.items)
        return SafeJSONResponse({"results": [wire.fork_item_json(r) for r in results]})

    @app.post("/v1/batch/close", tags=["batch"], **replies(wire.CloseResponse))
    async def batch_close(body: BatchClose) -> JSONResponse:
        """Close many sessions; each id is answered on its own."""
        results = await service.close(body.session_ids)
        return SafeJSONResponse({"results": [wire.close_item_json(e) for e in results]})

    def openapi() -> dict[str, Any]:  # built on first use: routes added later are in it
        if app.openapi_schema:
            return app.openapi_schema
        enabled = sorted(n for n, spec in service.env_specs.items() if spec.enabled)
        schema = with_session_links(with_descriptions(FastAPI.openapi(app)), enabled)
        app.openapi_schema = None  # FastAPI.openapi keeps its own: kept below once complete
        if enabled:
            app.openapi_schema = schema  # (not while the service starts: its envs come then)
        return schema

    app.openapi = openapi  # type: ignore[method-assign]
    return app


# The operations a session reply leads to, for the OpenAPI document's `links` (so that a
# stateful fuzzer such as schemathesis drives live sessions): (method, path, body).
SESSION_LINKS = {
    "GetSession": ("get", "/v1/sessions/{session_id}", None),
    "StepSession": ("post", "/v1/sessions/{session_id}/step", {
        "step_index": "$response.body#/step_index", "response": "<answer>Right</answer>"}),
    "ResetSession": ("post", "/v1/sessions/{session_id}/reset", None),
    "ForkSession": ("post", "/v1/sessions/{session_id}/fork", None),
    "SessionFrame": ("get", "/v1/sessions/{session_id}/frame.png", None),
    "CloseSession": ("delete", "/v1/sessions/{session_id}", None),
}  # fmt: skip


def with_session_links(schema: dict[str, Any], envs: list[str] | None = None) -> dict[str, Any]:
    """Add OpenAPI links from every reply that carries a session id (create, get, reset,
    step) to the operations on that session, with the reply's step_index for the step;
    and list the environments this server enables as the values `env` may take."""
    env_field = schema.get("components", {}).get("schemas", {}).get("SessionOptions", {})
    if envs and "env" in env_field.get("properties", {}):
        env_field["properties"]["env"]["enum"] = envs
    paths = schema.get("paths", {})
    links = {}
    for name, (method, path, body) in SESSION_LINKS.items():
        operation = paths.get(path, {}).get(method)
        if operation is None:
            continue
        link: dict[str, Any] = {
            "operationId": operation["operationId"],
            "parameters": {"session_id": "$response.body#/session_id"},
        }
        if body is not None:
            link["requestBody"] = body
        links[name] = link
    for path, method in (
        ("/v1/sessions", "post"),
        ("/v1/sessions/{session_id}", "get"),
        ("/v1/sessions/{session_id}/reset", "post"),
        ("/v1/sessions/{session_id}/step", "post"),
    ):
        operation = paths.get(path, {}).get(method)
        if operation is not None:
            operation["responses"]["200"]["links"] = links
    return schema


# Path parameters many routes share, described once for the OpenAPI document.
PARAMETERS = {
    "session_id": "The session's id, as its create reply gave it (session_id).",
    "env": "An environment's name, e.g. sokoban (GET /v1/envs lists them).",
}


def with_descriptions(schema: dict[str, Any]) -> dict[str, Any]:
    """Describe the shared path parameters, and document request-validation failures as
    what this app answers for them (an ErrorReply with status 422, `_on_validation`)
    instead of FastAPI's default HTTPValidationError, which it never sends."""
    for operations in schema.get("paths", {}).values():
        for operation in operations.values():
            for parameter in operation.get("parameters", []):
                parameter.setdefault("description", PARAMETERS.get(parameter["name"], ""))
            invalid = operation.get("responses", {}).get("422", {})
            content = invalid.get("content", {}).get("application/json", {})
            if content.get("schema", {}).get("$ref", "").endswith("/HTTPValidationError"):
                content["schema"] = {"$ref": "#/components/schemas/ErrorReply"}
                invalid["description"] = "INVALID_ARGUMENT: a malformed request, naming the field"
    schemas = schema.get("components", {}).get("schemas", {})
    for builtin in ("HTTPValidationError", "ValidationError"):
        schemas.pop(builtin, None)
    return schema
