"""VAGEN's legacy batch server (`vagen/server/server.py`), for its verl rollout manager.

Off unless the operator enables it (`visenv serve --vagen-legacy`): its client sends no
credentials, so these routes are served without the bearer token (see the README).

    (all under /compat/vagen-legacy)
    GET  /health
    POST /environments  {"ids2configs": {id: {"env_name", "env_config", "seed"?}}}
    POST /batch/reset   {"ids2seeds": {id: seed}}    -> {"results": {id: [obs, info]}}
    POST /batch/step    {"ids2actions": {id: text}}  -> {"results": {id: [obs, reward, done, info]}}
    POST /batch/reward  {"env_ids": [id]}            -> {"rewards": {id: float}}
    POST /batch/system_prompt {"env_ids": [id]}      -> {"system_prompts": {id: str}}
    POST /batch/close   {"env_ids": [id]}

An observation is `{"obs_str": "... <image> ...", "multi_modal_data": {"<image>":
[{"__pil_image__": "<base64 PNG>"}]}}`. A bad item answers alone: a failed reset is
`[{}, {"error": ...}]`, a failed step `[{}, 0.0, true, {"error": ...}]`; ids a call can't
find are listed under "errors". Client ids live in a bounded table, per credential
(none: one shared namespace), forgotten when idle as long as the service's idle timeout.
"""

from __future__ import annotations

import base64
from typing import Any

from fastapi import APIRouter, Body, Request
from fastapi.responses import JSONResponse

from env_server.service.models import ServiceError, SessionReply
from env_server.service.protocol import SessionService, check_env

from .common import PREFIX, Binding, IdTable, full_error, info_of, request_namespace
from .vagen_config import session_options

LEGACY_PREFIX = f"{PREFIX}/vagen-legacy"


def observation(reply: SessionReply) -> dict[str, Any]:
    obs: dict[str, Any] = {"obs_str": reply.observation.text}
    if reply.observation.images:
        obs["multi_modal_data"] = {
            "<image>": [
                {"__pil_image__": base64.b64encode(image.data).decode("ascii")}
                for image in reply.observation.images
            ]
        }
    return obs


def _field(body: Any, name: str, kind: type) -> Any:
    if not isinstance(body, dict) or not isinstance(body.get(name), kind):
        raise ServiceError(
            "INVALID_ARGUMENT",
            f"missing required parameter: {name} (a JSON {kind.__name__})",
            name,
        )
    return body[name]


def _bad_request(error: ServiceError) -> JSONResponse:
    return JSONResponse({"error": error.to_json()}, status_code=400)


def legacy_router(service: SessionService, table: IdTable) -> APIRouter:
    router = APIRouter(prefix=LEGACY_PREFIX, tags=["compat: VAGEN legacy"])

    def find(ns: str, ids: list[Any]) -> tuple[dict[str, Binding], dict[str, dict]]:
        found, errors = {}, {}
        for peer_id in map(str, ids):
            binding = table.get(ns, peer_id)
            if binding is None:
                errors[peer_id] = ServiceError(
                    "NOT_FOUND", f"environment {peer_id} not found", "env_id"
                ).to_json()
            else:
                found[peer_id] = binding
        return found, errors

    def forget_lost(ns: str, peer_id: str, result: Any) -> None:
        if isinstance(result, ServiceError) and result.code in ("NOT_FOUND", "SESSION_LOST"):
            table.pop(ns, peer_id)

    @router.get("/health")
    async def health() -> dict[str, Any]:
        """The legacy adapter's health: status, registered envs, active environments."""
        state = await service.health()
        return {
            "status": "ok" if state["status"] == "ok" else state["status"],
            "message": "visenv: VAGEN legacy batch adapter",
            "registered_envs": sorted(n for n, s in service.env_specs.items() if s.enabled),
            "active_environments": len(table),
        }

    @router.post("/environments")
    async def environments(request: Request, body: Any = Body(None)) -> JSONResponse:
        """Create environments by client-chosen ids (ids2configs); errors per id."""
        try:
            ids2configs = _field(body, "ids2configs", dict)
        except ServiceError as error:
            return _bad_request(error)
        ns = request_namespace(request.scope)
        errors: dict[str, dict] = {}
        planned: list[tuple[str, dict]] = []
        for peer_id, config in ids2configs.items():
            try:
                if not isinstance(config, dict):
                    raise ServiceError("INVALID_ARGUMENT", "a config must be an object", peer_id)
                unknown = sorted(set(config) - {"env_name", "env_config", "seed"})
                if unknown:
                    raise ServiceError(
                        "INVALID_ARGUMENT", f"unknown config key(s) {unknown}", unknown[0]
                    )
                env = str(config.get("env_name"))
                refused = check_env(service.env_specs, env)
                if refused is not None:  # named by this protocol's key
                    raise ServiceError(refused.code, refused.message, "env_name")
                spec = service.env_specs[env]
                seed = config.get("seed", 0)
                if isinstance(seed, bool) or not isinstance(seed, int):
                    raise ServiceError("INVALID_ARGUMENT", "seed must be an integer", "seed")
                fields = set(spec.config_schema.get("properties", {}))
                planned.append(
                    (peer_id, session_options(env, config.get("env_config") or {}, fields, seed))
                )
            except ServiceError as error:
                errors[peer_id] = error.to_json()
        # an id created again replaces its session (as VAGEN's server did)
        old = [b.session_id for b in (table.pop(ns, pid) for pid, _ in planned) if b]
        if old:
            await service.close(old)
        room = table.room()
        for peer_id, _ in planned[max(room, 0) :]:
            errors[peer_id] = full_error(table).to_json()
        planned = planned[: max(room, 0)]
        replies = await service.create([options for _, options in planned])
        for (peer_id, options), reply in zip(planned, replies, strict=True):
            if isinstance(reply, ServiceError):
                errors[peer_id] = reply.to_json()
                continue
            binding = Binding(reply.session_id, options["env"], seed=options.get("seed", 0))
            binding.update(reply)
            table.put(ns, peer_id, binding)
        body = {"success": not errors, "errors": errors}
        if errors:
            body["error"] = "; ".join(f"{k}: {e['message']}" for k, e in errors.items())
        return JSONResponse(body)

    @router.post("/batch/reset")
    async def reset(request: Request, body: Any = Body(None)) -> JSONResponse:
        """Reset environments (ids2seeds): per id, the observation and info."""
        try:
            ids2seeds = _field(body, "ids2seeds", dict)
        except ServiceError as error:
            return _bad_request(error)
        ns = request_namespace(request.scope)
        found, errors = find(ns, list(ids2seeds))
        results: dict[str, Any] = {pid: [{}, {"error": e}] for pid, e in errors.items()}
        fresh, todo = [], []
        for peer_id, binding in found.items():
            seed = ids2seeds[peer_id]
            if seed is not None and not isinstance(seed, int):
                error = ServiceError("INVALID_ARGUMENT", "seed must be an integer", "seed")
                results[peer_id] = [{}, {"error": error.to_json()}]
            elif binding.fresh and seed in (None, binding.seed):
                fresh.append(peer_id)  # created at this seed and not stepped: answer as is
            else:
                todo.append(peer_id)
        got = await service.get([found[p].session_id for p in fresh])
        reset = await service.reset(
            [{"session_id": found[p].session_id, "seed": ids2seeds[p]} for p in todo]
        )
        for peer_id, reply in [*zip(fresh, got, strict=True), *zip(todo, reset, strict=True)]:
            if isinstance(reply, ServiceError):
                forget_lost(ns, peer_id, reply)
                results[peer_id] = [{}, {"error": reply.to_json()}]
                continue
            binding = found[peer_id]
            binding.update(reply)
            if ids2seeds[peer_id] is not None:  # reset to a known seed: a repeat is a no-op
                binding.fresh, binding.seed = True, ids2seeds[peer_id]
            elif peer_id not in fresh:  # the server chose the seed
                binding.fresh = False
            results[peer_id] = [observation(reply), info_of(reply)]
        return JSONResponse({"results": results})

    @router.post("/batch/step")
    async def step(request: Request, body: Any = Body(None)) -> JSONResponse:
        """Step environments with raw LLM text (ids2actions): per id, observation,
        reward, done, info."""
        try:
            ids2actions = _field(body, "ids2actions", dict)
        except ServiceError as error:
            return _bad_request(error)
        ns = request_namespace(request.scope)
        found, errors = find(ns, list(ids2actions))
        results: dict[str, Any] = {pid: [{}, 0.0, True, {"error": e}] for pid, e in errors.items()}
        items, order = [], []
        for peer_id, binding in found.items():
            text = ids2actions[peer_id]
            if not isinstance(text, str):
                error = ServiceError("INVALID_ARGUMENT", "an action must be a string", peer_id)
                results[peer_id] = [{}, 0.0, True, {"error": error.to_json()}]
                continue
            sid, index = binding.session_id, binding.step_index
            items.append({"session_id": sid, "step_index": index, "response": text})
            order.append(peer_id)
        for peer_id, reply in zip(order, await service.step(items), strict=True):
            if isinstance(reply, ServiceError):
                forget_lost(ns, peer_id, reply)
                results[peer_id] = [{}, 0.0, True, {"error": reply.to_json()}]
                continue
            binding = found[peer_id]
            binding.update(reply)
            binding.fresh = False
            done = reply.terminated or reply.truncated
            info = info_of(reply, ids2actions[peer_id])
            results[peer_id] = [observation(reply), reply.reward, done, info]
        return JSONResponse({"results": results})

    @router.post("/batch/reward")
    async def reward(request: Request, body: Any = Body(None)) -> JSONResponse:
        """VAGEN adds this to the sum of step rewards; visenv's step rewards hold everything,
        so a found id's final extra reward is 0.0 (unknown ids are errors, not zeros)."""
        try:
            env_ids = _field(body, "env_ids", list)
        except ServiceError as error:
            return _bad_request(error)
        found, errors = find(request_namespace(request.scope), env_ids)
        return JSONResponse({"rewards": {pid: 0.0 for pid in found}, "errors": errors})

    @router.post("/batch/system_prompt")
    async def system_prompt(request: Request, body: Any = Body(None)) -> JSONResponse:
        """The system prompt of each environment id."""
        try:
            env_ids = _field(body, "env_ids", list)
        except ServiceError as error:
            return _bad_request(error)
        found, errors = find(request_namespace(request.scope), env_ids)
        prompts = {pid: b.system_prompt or "" for pid, b in found.items()}
        return JSONResponse({"system_prompts": prompts, "errors": errors})

    @router.post("/batch/close")
    async def close(request: Request, body: Any = Body(None)) -> JSONResponse:
        """Close environments by id and free their sessions."""
        try:
            env_ids = _field(body, "env_ids", list)
        except ServiceError as error:
            return _bad_request(error)
        ns = request_namespace(request.scope)
        found, errors = find(ns, env_ids)
        for peer_id in found:
            table.pop(ns, peer_id)
        closed = await service.close([b.session_id for b in found.values()])
        for peer_id, error in zip(found, closed, strict=True):
            if error is not None and error.code not in ("NOT_FOUND", "SESSION_LOST"):
                errors[peer_id] = error.to_json()
        return JSONResponse({"status": "success" if not errors else "partial", "errors": errors})

    return router
