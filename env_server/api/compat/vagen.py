"""VAGEN's remote-env API (`vagen/envs_remote`): /connect + /call, multipart both ways.

Routes, per environment (`GymImageEnvClient(base_urls="http://host:port/compat/vagen/sokoban")`):

    GET  /compat/vagen/{env}/health    {"ok": true, ...}
    GET  /compat/vagen/{env}/sessions  statistics of the caller's sessions
    POST /compat/vagen/{env}/connect   data {"env_config", "seed"?}
                                       -> {"session_id"[, "obs", "info"]}
    POST /compat/vagen/{env}/call      data {"session_id", "method", "params"}
         system_prompt -> {"obs"}; reset {"seed"} -> {"obs", "info"};
         step {"action_str"} -> {"obs", "reward", "done", "info"}; close -> {"closed": true}

`env_config` is read as VAGEN main's (vagen_config.main_session_options): its keys, its
defaults and rewards, and `prompt_format: wm` in VAGEN main's layout (our `vagen_wm`).

Requests are multipart/form-data with a JSON part named `data`; replies are multipart/mixed:
the JSON part, then one raw image/png part per `<image>` in `obs`. Errors: 400 (bad
request or config key, naming it), 401, 404 (unknown session), 503 (server full).
Auth: `X-API-Key`, `?token=` or Bearer (checked by the app's middleware).
"""

from __future__ import annotations

import time
from typing import Any

from fastapi import APIRouter, Request, Response
from fastapi.responses import JSONResponse

from env_server.service.models import ServiceError, SessionReply
from env_server.service.protocol import SessionService, check_env

from .common import (
    PREFIX,
    Binding,
    IdTable,
    SafeJSONResponse,
    full_error,
    info_of,
    png_images,
    request_namespace,
)
from .multipart import mixed_reply, parse_data_part
from .vagen_config import main_session_options

STATUS = {
    "INVALID_ARGUMENT": 400,
    "FAILED_PRECONDITION": 400,
    "UNAUTHENTICATED": 401,
    "NOT_FOUND": 404,
    "SESSION_LOST": 404,
    "PAYLOAD_TOO_LARGE": 413,
    "CAPACITY": 503,
    "UNAVAILABLE": 503,
}
METHODS = ("system_prompt", "reset", "step", "close")


def _multipart_body(data_schema: dict[str, Any]) -> dict[str, Any]:
    """OpenAPI for a multipart/form-data request whose `data` part is JSON (so that a
    reader, or a fuzzer, knows what the route parses out of the raw body)."""
    return {
        "requestBody": {
            "required": True,
            "content": {
                "multipart/form-data": {
                    "schema": {
                        "type": "object",
                        "required": ["data"],
                        "properties": {"data": data_schema},
                    },
                    "encoding": {"data": {"contentType": "application/json"}},
                }
            },
        }
    }


CONNECT_BODY = _multipart_body({
    "type": "object",
    "properties": {
        "env_config": {"type": "object", "description": "VAGEN env_config keys (translated)"},
        "seed": {"type": ["integer", "null"], "minimum": 0},
    },
})  # fmt: skip
CALL_BODY = _multipart_body({
    "type": "object",
    "required": ["session_id", "method"],
    "properties": {
        "session_id": {"type": "string"},
        "method": {"type": "string", "enum": list(METHODS)},
        "params": {"type": "object", "description": "reset: {seed}; step: {action_str}"},
    },
})  # fmt: skip


def error_reply(error: ServiceError) -> JSONResponse:
    return SafeJSONResponse(
        {"error": error.to_json(), "detail": error.message}, status_code=STATUS.get(error.code, 500)
    )


def multipart(data: dict[str, Any], images: list[bytes] | None = None) -> Response:
    body, media_type = mixed_reply(data, images or [])
    return Response(body, media_type=media_type)


def vagen_router(service: SessionService, table: IdTable) -> APIRouter:
    """The routes above over `service` (EnvService or GatewayService)."""
    router = APIRouter(prefix=f"{PREFIX}/vagen/{{env}}", tags=["compat: VAGEN remote"])

    def lookup(request: Request, env: str, session_id: Any) -> Binding | ServiceError:
        if not isinstance(session_id, str) or not session_id:
            return ServiceError("INVALID_ARGUMENT", "session_id required", "session_id")
        binding = table.get(request_namespace(request.scope), session_id)
        if binding is None or binding.env != env:
            return ServiceError(
                "NOT_FOUND", f"session {session_id} not found (closed, idle, or another env's)"
            )
        return binding

    def episode_data(reply: SessionReply, raw: str | None = None) -> dict[str, Any]:
        return {"obs": reply.observation.text, "info": info_of(reply, raw)}

    @router.get("/health")
    async def health(env: str) -> JSONResponse:
        """VAGEN remote env health check: {ok, service, env}; 404 for an unknown env."""
        error = check_env(service.env_specs, env)
        status = (await service.health())["status"]
        body = {"ok": error is None and status == "ok", "service": "visenv", "env": env}
        return JSONResponse(body, status_code=error.http_status if error else 200)

    @router.get("/sessions")
    async def sessions(env: str, request: Request) -> JSONResponse:
        """The caller's VAGEN sessions of this env, with their idle times and the cap."""
        now = time.monotonic()
        mine = [b for _, b in table.items(request_namespace(request.scope)) if b.env == env]
        health = await service.health()
        timeout = table.idle_timeout
        return JSONResponse(
            {
                "num_sessions": len(mine),
                "max_sessions": health.get("max_sessions", table.max_entries),
                "session_timeout": timeout,
                "sessions": [
                    {
                        "session_id": b.session_id,
                        "created_at": b.created,
                        "idle_seconds": round(now - b.last_used, 3),
                        "will_timeout_in": (
                            round(max(0.0, timeout - (now - b.last_used)), 3) if timeout else None
                        ),
                    }
                    for b in mine
                ],
            }
        )

    @router.post("/connect", openapi_extra=CONNECT_BODY)
    async def connect(env: str, request: Request) -> Response:
        """VAGEN's connect: open a session with an env_config (and, given a seed, its
        first observation, as multipart)."""
        try:
            data = await parse_data_part(
                request.headers.get("content-type", ""), await request.body()
            )
            error = check_env(service.env_specs, env)
            if error is not None:
                raise error
            seed = data.get("seed")
            if seed is not None and (isinstance(seed, bool) or not isinstance(seed, int)):
                raise ServiceError("INVALID_ARGUMENT", "seed must be an integer", "seed")
            fields = set(service.env_specs[env].config_schema.get("properties", {}))
            config = data.get("env_config")  # absent or null: the defaults; [] or 0 is refused
            options = main_session_options(env, {} if config is None else config, fields, seed)
            if table.room() <= 0:
                raise full_error(table)
        except ServiceError as error:
            return error_reply(error)
        reply = (await service.create([options]))[0]
        if isinstance(reply, ServiceError):
            return error_reply(reply)
        binding = Binding(reply.session_id, env, seed=options.get("seed", 0))
        binding.update(reply)
        table.put(request_namespace(request.scope), reply.session_id, binding)
        if seed is None:
            return multipart({"session_id": reply.session_id})
        return multipart({"session_id": reply.session_id, **episode_data(reply)}, png_images(reply))

    @router.post("/call", openapi_extra=CALL_BODY)
    async def call(env: str, request: Request) -> Response:
        """VAGEN's call: reset, step, system_prompt or close a session (multipart
        replies carry the images)."""
        try:
            data = await parse_data_part(
                request.headers.get("content-type", ""), await request.body()
            )
            method, params = data.get("method"), data.get("params") or {}
            if method not in METHODS:
                raise ServiceError(
                    "INVALID_ARGUMENT", f"method {method!r} is not one of {METHODS}", "method"
                )
            if not isinstance(params, dict):
                raise ServiceError("INVALID_ARGUMENT", "params must be an object", "params")
            binding = lookup(request, env, data.get("session_id"))
            if isinstance(binding, ServiceError):
                raise binding
        except ServiceError as error:
            return error_reply(error)
        ns = request_namespace(request.scope)
        sid = binding.session_id
        if method == "close":
            table.pop(ns, sid)
            error = (await service.close([sid]))[0]
            if error is not None and error.code not in ("NOT_FOUND", "SESSION_LOST"):
                return error_reply(error)
            return multipart({"closed": True})
        if method == "system_prompt":
            return multipart({"obs": binding.system_prompt or ""})
        if method == "reset":
            seed = params.get("seed", 0)
            if isinstance(seed, bool) or not isinstance(seed, int):
                return error_reply(ServiceError("INVALID_ARGUMENT", "seed must be an integer"))
            if binding.fresh and seed == binding.seed:  # connect already reset to this seed
                reply = (await service.get([sid]))[0]
            else:
                reply = (await service.reset([{"session_id": sid, "seed": seed}]))[0]
            raw = None
        else:
            raw = params.get("action_str", "")
            if not isinstance(raw, str):
                return error_reply(ServiceError("INVALID_ARGUMENT", "action_str must be a string"))
            item = {"session_id": sid, "step_index": binding.step_index, "response": raw}
            reply = (await service.step([item]))[0]
        if isinstance(reply, ServiceError):
            if reply.code in ("NOT_FOUND", "SESSION_LOST"):
                table.pop(ns, sid)
            return error_reply(reply)
        binding.update(reply)
        binding.fresh = method == "reset"
        binding.seed = seed if method == "reset" else binding.seed
        data = episode_data(reply, raw)
        if method == "step":
            data = {
                "obs": data["obs"],
                "reward": reply.reward,
                "done": reply.terminated or reply.truncated,
                "info": data["info"],
            }
        return multipart(data, png_images(reply))

    return router
