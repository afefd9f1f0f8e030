"""The peers' protocols, each a thin adapter over the same session service.

    add_compat_routes(app, service, max_sessions=4096, idle_timeout=600, vagen_legacy=False)

- OpenEnv over WebSocket:    /compat/openenv/{env}/ws (+ /health, /schema, /metadata)
- VAGEN remote envs:         /compat/vagen/{env}/{health,sessions,connect,call}
- VAGEN legacy batch server: /compat/vagen-legacy/... (only when the operator enables it)

Every adapter session is an ordinary service session: it shows in /metrics, counts
towards the cap and is closed by the idle reaper. README.md, "Speaking the peers'
protocols", has the URLs to give each peer's client and what each adapter supports.
"""

from __future__ import annotations

from fastapi import FastAPI

from env_server.service.protocol import SessionService

from .common import PREFIX, IdTable
from .openenv import openenv_router
from .vagen import vagen_router
from .vagen_legacy import LEGACY_PREFIX, legacy_router

__all__ = ["LEGACY_PREFIX", "PREFIX", "add_compat_routes"]


def add_compat_routes(
    app: FastAPI,
    service: SessionService,
    *,
    max_sessions: int = 4096,
    idle_timeout: float = 600.0,
    vagen_legacy: bool = False,
    legacy_max_sessions: int | None = None,
) -> None:
    """Mount the adapters on `app` over `service` (EnvService or GatewayService). The
    legacy adapter's anonymous sessions have a cap of their own (`legacy_max_sessions`,
    default half of `max_sessions`), so that they can't take every session of the server."""
    app.include_router(openenv_router(service))
    app.include_router(vagen_router(service, IdTable(max_sessions, idle_timeout)))
    if vagen_legacy:
        cap = legacy_max_sessions or max(1, max_sessions // 2)
        app.include_router(legacy_router(service, IdTable(cap, idle_timeout)))
