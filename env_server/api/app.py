"""The server process: HTTP (uvicorn) and gRPC (grpc.aio) over one EnvService, one loop.

    asyncio.run(serve(Settings(port=8000, grpc_port=50051)))

`serve` binds both ports first (port 0 picks a free one) and serves at once, prints where
everything is (one line starting `visenv serving` that tests and scripts can read), then
starts the workers behind it (calls made meanwhile wait for them; the environments warm up
after that, /health and gRPC health say which are ready, and a line `visenv ready` says
when all are), and runs until SIGINT/SIGTERM and shuts down the workers.
"""

from __future__ import annotations

import asyncio
import logging
import signal
import socket
import sys
import time
from collections.abc import Callable
from typing import Any

import uvicorn

from env_server.service.gateway import GatewayService
from env_server.service.protocol import SessionService
from env_server.service.service import EnvService
from env_server.service.settings import Settings
from env_server.service.worker import LOG_FORMAT

from .compat import LEGACY_PREFIX, add_compat_routes
from .connections import ConnectionLimits, RateLimitedLog, default_max_connections, limited_http
from .rest import build_app

log = logging.getLogger("visenv.serve")


def _bind(host: str, port: int) -> socket.socket:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    # IPPROTO_TCP given explicitly: asyncio enables TCP_NODELAY only on sockets whose proto
    # says TCP; without it every keep-alive reply waited ~40 ms for a delayed ACK (Nagle)
    sock = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError as exc:  # "Address already in use" alone does not say which port
        sock.close()
        raise OSError(exc.errno, f"cannot listen on {host}:{port}: {exc.strerror}") from None
    sock.listen(2048)  # connections queue until uvicorn accepts them
    return sock


def _free_port(host: str) -> int:
    with _bind(host, 0) as sock:
        return sock.getsockname()[1]


def _url_host(host: str) -> str:
    if host in ("0.0.0.0", "::", ""):
        return "127.0.0.1"
    return f"[{host}]" if ":" in host else host


def _load_grpc() -> tuple[Callable[..., Any] | None, str | None]:
    try:
        from .grpc_server import build_grpc_server
    except ImportError as exc:
        return None, str(exc)
    return build_grpc_server, None


async def _announce_ready(
    service: SessionService, announce: Callable[[str], None], grpc_server: Any, started_at: float
) -> None:
    """Keep gRPC health's per-environment statuses (service `visenv.env.<name>`) in step
    with the service's readiness, and say once every environment is ready."""
    from grpc_health.v1 import health_pb2

    said = False
    while True:
        ready = service.envs_ready()
        health = getattr(grpc_server, "health", None)
        if health is not None:
            for name, ok in ready.items():
                status = health_pb2.HealthCheckResponse.SERVING if ok else (
                    health_pb2.HealthCheckResponse.NOT_SERVING
                )  # fmt: skip
                await health.set(f"visenv.env.{name}", status)
        if all(ready.values()) and not said:
            said = True
            took = time.monotonic() - started_at
            announce(f"visenv ready: every environment warm after {took:.1f} s")
            sys.stdout.flush()
        await asyncio.sleep(0.1)  # gRPC health follows /health within this


async def serve(settings: Settings, announce: Callable[[str], None] = print) -> None:
    logging.basicConfig(level=logging.INFO, format=LOG_FORMAT)  # errors carry their ids there
    limited = RateLimitedLog(settings.log_burst, 60.0)  # no flood (accept errors...) fills a disk
    for handler in logging.getLogger().handlers:
        handler.addFilter(limited)
    max_connections = settings.max_connections or default_max_connections()
    if settings.upstreams:  # gateway mode: the sessions live on the upstream servers
        service: SessionService = GatewayService(
            settings.upstreams,
            settings.token,
            lost_after=settings.upstream_lost_after,
            max_request_bytes=settings.max_request_bytes,
        )
        where = f"upstreams {', '.join(settings.upstreams)}"
        await service.start()  # quick: channels to the upstreams
    else:
        service = EnvService(settings)
        where = f"workers {settings.workers}"
    grpc_server = None
    try:
        legacy = (LEGACY_PREFIX,) if settings.vagen_legacy else ()
        app = build_app(service, settings.token, settings.max_request_bytes, open_prefixes=legacy)
        add_compat_routes(
            app,
            service,
            max_sessions=settings.max_sessions,
            idle_timeout=settings.idle_timeout,
            vagen_legacy=settings.vagen_legacy,
            legacy_max_sessions=settings.legacy_cap,
        )
        http_sock = _bind(settings.host, settings.port)
        http_port = http_sock.getsockname()[1]
        config = uvicorn.Config(
            app,
            log_level="warning",
            access_log=False,
            timeout_graceful_shutdown=5,
            lifespan="off",
            ws_max_size=settings.max_request_bytes,  # OpenEnv's WebSocket messages
            http=limited_http(
                ConnectionLimits(settings.header_timeout, settings.body_timeout, max_connections)
            ),
            timeout_keep_alive=settings.keep_alive_timeout,
        )
        # uvicorn's loggers have their own handlers (set up by its Config): limited too, or
        # a client sending garbage writes "Invalid HTTP request received." per connection
        for name in ("uvicorn", "uvicorn.error", "uvicorn.access"):
            for handler in logging.getLogger(name).handlers:
                handler.addFilter(limited)
        server = uvicorn.Server(config)
        server.install_signal_handlers = lambda: None  # type: ignore[method-assign]

        build_grpc, grpc_missing = _load_grpc()
        grpc_line = f"gRPC unavailable ({grpc_missing})"
        if build_grpc is not None:
            grpc_port = settings.grpc_port or _free_port(settings.host)
            address = f"{settings.host}:{grpc_port}"
            grpc_server = build_grpc(
                service,
                address,
                settings.token,
                settings.max_request_bytes,
                options=[  # connection limits: as HTTP's (settings.py)
                    ("grpc.max_allowed_incoming_connections", max_connections),
                    ("grpc.server_handshake_timeout_ms", int(settings.header_timeout * 1000)),
                    ("grpc.max_connection_idle_ms", int(settings.grpc_idle_timeout * 1000)),
                    ("grpc.keepalive_time_ms", 60_000),  # dead peers found and closed
                    ("grpc.keepalive_timeout_ms", 20_000),
                    ("grpc.max_concurrent_streams", 1024),
                ],
            )
            await grpc_server.start()
            grpc_line = f"gRPC {_url_host(settings.host)}:{grpc_port}"

        # serve at once: the addresses now, the environments' warm-up behind them (calls
        # made meanwhile wait for the workers; /health and gRPC health say what is ready)
        http_task = asyncio.create_task(server.serve(sockets=[http_sock]))
        base = f"http://{_url_host(settings.host)}:{http_port}"
        envs = ", ".join(settings.envs or ()) or "every one available"
        announce(
            f"visenv serving: HTTP {base}  {grpc_line}  docs {base}/docs  play {base}/play  "
            f"{where}  envs {envs} (warming up: {base}/health says when each is ready)"
        )
        sys.stdout.flush()
        started_at = time.monotonic()
        try:
            if isinstance(service, EnvService):
                await service.start()
        except BaseException:
            server.should_exit = True
            await asyncio.gather(http_task, return_exceptions=True)
            raise
        for name in () if settings.upstreams else settings.envs or ():
            spec = service.env_specs[name]
            if not spec.available:
                announce(f"warning: {name} is unavailable here: {spec.unavailable_reason}")
        watch = asyncio.create_task(_announce_ready(service, announce, grpc_server, started_at))

        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, stop.set)
        if isinstance(service, EnvService):  # SIGUSR1: drain (no new sessions)
            loop.add_signal_handler(signal.SIGUSR1, service.drain)
        stop_task = asyncio.create_task(stop.wait())
        await asyncio.wait({http_task, stop_task}, return_when=asyncio.FIRST_COMPLETED)
        server.should_exit = True
        await asyncio.gather(http_task, return_exceptions=True)
        stop_task.cancel()
        watch.cancel()
    finally:
        if grpc_server is not None:
            grpc_server.visenv.end_streams()  # streams held open by clients end now
            await grpc_server.stop(grace=2)
        await service.stop()
