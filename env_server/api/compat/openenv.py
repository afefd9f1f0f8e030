"""OpenEnv's WebSocket protocol, per environment: `GenericEnvClient(base_url=
"http://host:port/compat/openenv/sokoban")` talks to `/compat/openenv/sokoban/ws`.

One service session per connection: made at the first reset (with that reset's options)
or at the first step/state (with defaults), closed on `close` or disconnect.

    -> {"type": "reset", "data": {"seed"?, "format"?, "representation"?, "config"?,
                                  "reasoning"?, "episode_id"?}}
    -> {"type": "step", "data": {"response": "<answer>Left</answer>"} | {"actions": ["Left"]}}
    -> {"type": "state"}      -> {"type": "close"}
    <- {"type": "observation", "data": {"observation": {text, images (base64 PNG),
            system_prompt, ground_truth, ...}, "reward", "done", "metadata": {info, ...}}}
    <- {"type": "state", "data": {"episode_id", "step_count", ...}}
    <- {"type": "error", "data": {"message", "code", "field"}}   codes: INVALID_JSON,
       UNKNOWN_TYPE, VALIDATION_ERROR, EXECUTION_ERROR, CAPACITY_REACHED, SESSION_ERROR

Also `GET .../health`, `.../schema`, `.../metadata`. The bearer token (or `?token=`) is
checked at the handshake by the app's middleware.
"""

from __future__ import annotations

import asyncio
import base64
import json
import logging
from typing import Annotated, Any

from fastapi import APIRouter, WebSocket, WebSocketDisconnect
from fastapi.responses import JSONResponse
from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, ValidationError, model_validator

from env_server.service.models import (
    ActionModel,
    FreeObject,
    Seed,
    ServiceError,
    SessionReply,
    Text,
)
from env_server.service.protocol import SessionService, check_env

from .common import PREFIX, json_bytes

log = logging.getLogger("visenv.openenv")
# a message longer than this is parsed in a thread, off the event loop
OFFLOAD_BYTES = 64 * 1024

WS_CODE = {
    "INVALID_ARGUMENT": "VALIDATION_ERROR",
    "CAPACITY": "CAPACITY_REACHED",
    "NOT_FOUND": "SESSION_ERROR",
    "SESSION_LOST": "SESSION_ERROR",
}


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)


class OpenEnvReset(_Strict):
    """`reset` data: the episode's seed and, at the first reset, the session's options
    (held to the service's rules: a seed is an integer, not `true` or "5")."""

    seed: Seed | None = None
    episode_id: Text | None = Field(None, max_length=255)
    format: Text | None = None
    representation: Text | None = None
    config: FreeObject | None = None
    reasoning: FreeObject | None = None


def _named(action: Any) -> Any:
    return {"name": action} if isinstance(action, str) else action


class OpenEnvAction(_Strict):
    """`step` data: the agent's raw response, or explicit actions (names or objects)."""

    response: Text | None = None
    # a name stands for {"name": name}: one model, so an error names the action's field
    actions: list[Annotated[ActionModel, BeforeValidator(_named)]] | None = None
    metadata: FreeObject = Field(default_factory=dict)  # OpenEnv's Action base field

    @model_validator(mode="after")
    def _one(self) -> OpenEnvAction:
        if (self.response is None) == (self.actions is None):
            raise ValueError("give exactly one of 'response' or 'actions'")
        return self


class OpenEnvObservation(BaseModel):
    text: str = Field(description="one '<image>' placeholder per image")
    images: list[str] = Field(description="base64 PNG files")
    system_prompt: str | None
    ground_truth: dict[str, Any]
    env: str
    session_id: str
    episode: int
    turn: int


class OpenEnvState(BaseModel):
    episode_id: str | None
    step_count: int
    env: str
    session_id: str | None = None
    episode: int | None = None
    terminated: bool = False
    truncated: bool = False
    success: bool = False


def ws_error(error: ServiceError) -> dict[str, Any]:
    code = WS_CODE.get(error.code, "EXECUTION_ERROR")
    data = {"message": error.message, "code": code, "field": error.field}
    return {"type": "error", "data": {**data, "visenv_code": error.code}}


def _message(code: str, message: str) -> dict[str, Any]:
    return {"type": "error", "data": {"message": message, "code": code}}


class Connection:
    """The one session of one WebSocket connection."""

    def __init__(self, service: SessionService, env: str) -> None:
        self.service = service
        self.env = env
        self.session_id: str | None = None
        self.options: dict[str, Any] = {}
        self.last: SessionReply | None = None
        self.system_prompt: str | None = None
        self.episode_id: str | None = None

    async def _create(
        self, options: dict[str, Any], seed: int | None
    ) -> SessionReply | ServiceError:
        item = {**options, "env": self.env, **({} if seed is None else {"seed": seed})}
        reply = (await self.service.create([item]))[0]
        if isinstance(reply, SessionReply):
            self.session_id, self.options = reply.session_id, options
        return reply

    async def close(self) -> None:
        if self.session_id is not None:
            session_id, self.session_id = self.session_id, None
            await self.service.close([session_id])

    def _remember(self, reply: SessionReply | ServiceError) -> SessionReply | ServiceError:
        if isinstance(reply, SessionReply):
            self.last = reply
            self.system_prompt = reply.system_prompt or self.system_prompt
        elif reply.code in ("NOT_FOUND", "SESSION_LOST"):
            self.session_id = None  # reaped or lost: the next reset makes a new one
        return reply

    async def reset(self, data: dict[str, Any]) -> SessionReply | ServiceError:
        body = OpenEnvReset.model_validate(data)
        options = body.model_dump(exclude_none=True, exclude={"seed", "episode_id"})
        options["image_encoding"] = "png"
        self.episode_id = body.episode_id
        if self.session_id is not None and options == self.options:
            item = {"session_id": self.session_id, "seed": body.seed}
            return self._remember((await self.service.reset([item]))[0])
        await self.close()  # new options: a new session
        return self._remember(await self._create(options, body.seed))

    async def step(self, data: dict[str, Any]) -> SessionReply | ServiceError:
        action = OpenEnvAction.model_validate(data)
        if self.session_id is None:
            made = await self.reset({})
            if isinstance(made, ServiceError):
                return made
        assert self.session_id is not None and self.last is not None
        item: dict[str, Any] = {"session_id": self.session_id, "step_index": self.last.step_index}
        if action.response is not None:
            item["response"] = action.response
        else:
            item["actions"] = action.actions  # validated already: taken as they are
        return self._remember((await self.service.step([item]))[0])

    async def state(self) -> dict[str, Any] | ServiceError:
        if self.session_id is None:
            return OpenEnvState(episode_id=None, step_count=0, env=self.env).model_dump()
        reply = self._remember((await self.service.get([self.session_id]))[0])
        if isinstance(reply, ServiceError):
            return reply
        return OpenEnvState(
            episode_id=self.episode_id or f"{reply.session_id}/{reply.episode}",
            step_count=reply.step_index,
            env=self.env,
            session_id=reply.session_id,
            episode=reply.episode,
            terminated=reply.terminated,
            truncated=reply.truncated,
            success=reply.success,
        ).model_dump()

    def observation(self, reply: SessionReply) -> dict[str, Any]:
        obs = reply.observation
        observation = OpenEnvObservation(
            text=obs.text,
            images=[base64.b64encode(image.data).decode("ascii") for image in obs.images],
            system_prompt=self.system_prompt,
            ground_truth=obs.ground_truth,
            env=reply.env,
            session_id=reply.session_id,
            episode=reply.episode,
            turn=reply.turn,
        )
        return {
            "type": "observation",
            "data": {
                "observation": observation.model_dump(),
                "reward": reply.reward,
                "done": reply.terminated or reply.truncated,
                "metadata": {
                    "info": reply.info,
                    "observation_info": obs.info,
                    "reward_parts": reply.reward_parts.to_json(),
                    "terminated": reply.terminated,
                    "truncated": reply.truncated,
                    "success": reply.success,
                    "step_index": reply.step_index,
                },
            },
        }

    async def handle(self, raw: str) -> tuple[dict[str, Any], bool]:
        """The reply to one client message, and whether the connection ends."""
        try:
            message = json.loads(raw) if len(raw) <= OFFLOAD_BYTES else (
                await asyncio.to_thread(json.loads, raw))  # fmt: skip
        except json.JSONDecodeError as exc:
            return _message("INVALID_JSON", f"Invalid JSON: {exc}"), False
        except RecursionError:
            return _message("INVALID_JSON", "Invalid JSON: nested too deep to parse"), False
        if not isinstance(message, dict):
            return _message("INVALID_JSON", "a message must be a JSON object"), False
        kind, data = message.get("type", ""), message.get("data") or {}
        if not isinstance(data, dict):
            return _message("VALIDATION_ERROR", "'data' must be a JSON object"), False
        try:
            if kind == "reset":
                result: Any = await self.reset(data)
            elif kind == "step":
                result = await self.step(data)
            elif kind == "state":
                result = await self.state()
                if isinstance(result, dict):
                    return {"type": "state", "data": result}, False
            elif kind == "close":
                return {}, True
            else:
                return _message("UNKNOWN_TYPE", f"Unknown message type: {kind}"), False
        except ValidationError as exc:
            return ws_error(ServiceError.from_validation(exc)), False
        except ServiceError as error:  # a whole call refused (e.g. the server is starting)
            return ws_error(error), False
        except Exception as exc:  # a bug: answered, with the id the log carries
            return ws_error(ServiceError.internal(exc, f"WebSocket {kind}", log)), False
        if isinstance(result, ServiceError):
            return ws_error(result), False
        return self.observation(result), False


def openenv_router(service: SessionService) -> APIRouter:
    router = APIRouter(prefix=f"{PREFIX}/openenv/{{env}}", tags=["compat: OpenEnv"])

    def unknown(env: str) -> ServiceError | None:
        return check_env(service.env_specs, env)

    def not_found(error: ServiceError) -> JSONResponse:
        return JSONResponse({"error": error.to_json()}, status_code=error.http_status)

    @router.get("/health")
    async def health(env: str) -> JSONResponse:
        """OpenEnv's health check for one environment: {status, env}; 404 for an
        unknown env."""
        error = unknown(env)
        if error is not None:
            return not_found(error)
        status = (await service.health())["status"]
        return JSONResponse({"status": "healthy" if status == "ok" else status, "env": env})

    @router.get("/schema")
    async def schema(env: str) -> JSONResponse:
        """OpenEnv's JSON schemas of the action, observation and state messages."""
        error = unknown(env)
        if error is not None:
            return not_found(error)
        return JSONResponse(
            {
                "action": OpenEnvAction.model_json_schema(),
                "observation": OpenEnvObservation.model_json_schema(),
                "state": OpenEnvState.model_json_schema(),
            }
        )

    @router.get("/metadata")
    async def metadata(env: str) -> JSONResponse:
        """OpenEnv's environment metadata: name, description, action space, config
        schema."""
        error = unknown(env)
        if error is not None:
            return not_found(error)
        spec = service.env_specs[env]
        return JSONResponse(
            {
                "name": env,
                "description": spec.description,
                "version": "visenv 0.1.0",
                "author": None,
                "documentation_url": None,
                "readme_content": None,
                "action_space": spec.action_space,
                "config_schema": spec.config_schema,
            }
        )

    @router.websocket("/ws")
    async def ws(websocket: WebSocket, env: str) -> None:
        await websocket.accept()
        error = unknown(env)
        if error is not None:
            await websocket.send_json(ws_error(error))
            await websocket.close(code=1008)
            return
        connection = Connection(service, env)
        try:
            while True:
                message = await websocket.receive()
                if message["type"] == "websocket.disconnect":
                    break
                raw = message.get("text")
                if raw is None:
                    raw = (message.get("bytes") or b"").decode("utf-8", "replace")
                reply, done = await connection.handle(raw)
                if done:
                    break
                # (json_bytes: text from an environment can't fail the send)
                await websocket.send_text(json_bytes(reply).decode("utf-8"))
        except WebSocketDisconnect:
            pass
        finally:
            # shielded: a dropped connection must still close its session
            await asyncio.shield(connection.close())
            if websocket.client_state.name == "CONNECTED":
                try:
                    await websocket.close()
                except WebSocketDisconnect:  # the client went first (its `close`, then away)
                    pass

    return router
