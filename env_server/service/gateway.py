"""GatewayService: `EnvService`'s interface in front of other visenv servers.

It is what `visenv serve --upstream light:50051 --upstream navigation:50051` runs, and
so what `docker compose up envs` puts on one HTTP and one gRPC port: the REST and gRPC
adapters serve it exactly as they serve `EnvService`; only where sessions live differs.

- Upstreams are named `host:grpc_port`. A name may resolve to many addresses (a compose
  service scaled with `--scale`, a Kubernetes headless Service): every address is one
  upstream server, and names are resolved again every `refresh` seconds, so replicas
  added later take new sessions. `NODE=host:grpc_port` names one upstream whose node id
  is known beforehand (a StatefulSet pod), so its sessions are placed even before it
  first answers.
- The gateway keeps no session state: a session id names the upstream that made it
  (its node and boot, `session_ids.py`), and each upstream tells the gateway its own
  node and boot (its Status). So any replica of the gateway, or one just restarted,
  routes every session; an id naming a node the gateway does not know is NOT_FOUND,
  and no connection is made for it (ids name servers, never addresses).
- A new session goes to the least-loaded upstream that offers its environment.
- The routing is the SDK's own `clients.router.Router` (the same placement and one batch
  per server), with the gateway's `locate` hook (the id names its server), and each
  upstream is the SDK's `GrpcTransport`; their errors become the gateway's at its edge
  (`service_error`), and a call that got no answer at all (`ConnectionFailure`) is the
  upstream being down.
- It publishes, and holds every call to, its upstreams' limits (the strictest of each), so
  a call over `max_batch_items` is refused whole, at once, as a server refuses it.
- Steps are passed through with the client's own `step_index`, so a retried step is
  answered from the upstream's memory, never applied twice.
- An upstream that does not answer makes its sessions answer UNAVAILABLE (retry, with
  the same step_index); one still unreachable after `lost_after` seconds, or answering
  as a new process (another boot: it restarted), has lost them: SESSION_LOST. The
  other upstreams' sessions go on.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import re
import socket
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar

from prometheus_client import Gauge

from clients.errors import ConnectionFailure, VisenvError
from clients.router import Router, Server
from clients.transport import GrpcTransport
from visenv import wire
from visenv.wire import convert

from .metrics import Metrics
from .models import (
    EnvSpec,
    ForkItem,
    ResetItem,
    Result,
    ServiceError,
    SessionOptions,
    SessionReply,
    StepItem,
)
from .protocol import check_batch, check_env, unknown_session, validate
from .session_ids import NODE_PATTERN, Origin, origin_of

log = logging.getLogger("visenv.gateway")
T = TypeVar("T")
HEALTH_PROBE_SECONDS = 2.0  # how long /health waits for the upstreams' own figures


def service_error(exc: VisenvError) -> ServiceError:
    """An upstream's error (as the SDK's transport gives it) as the gateway's own; its
    deadline passing is the upstream being unavailable."""
    error = ServiceError(
        "UNAVAILABLE" if exc.code == "DEADLINE_EXCEEDED" else exc.code, exc.message, exc.field
    )
    error.error_id = exc.error_id
    return error


@dataclass(eq=False)
class _Server(Server):
    """One upstream server as the gateway last saw it (`Server`: its transport, load,
    environments, and whether it drains, as it last reported)."""

    envs: set[str] | None = field(default_factory=set)  # none until it answers
    sessions: int = 0  # as it last reported, plus those placed there since
    pinned: str | None = None  # the node id its configuration gives (NODE=address)
    node: str | None = None  # what it answered (its Status)
    boot: str | None = None
    down_since: float | None = None  # monotonic time of the first failure in a row
    resolved: bool = True  # its address is among its name's current addresses
    limits: dict[str, Any] = field(default_factory=dict)  # as its Status said
    ready: dict[str, bool] = field(default_factory=dict)  # per environment, as its Status said

    @property
    def up(self) -> bool:
        return self.down_since is None and self.boot is not None

    def names(self, origin: Origin) -> bool:
        """Whether `origin` names this server's node (in whichever boot)."""
        return origin.node in (self.node, self.pinned)

    def labels(self) -> tuple[str, str]:
        """Its metrics' labels: node, address."""
        return self.node or self.pinned or "", self.address

    def describe(self) -> str:
        return f"{self.node or self.pinned or '?'} ({self.address})"


class GatewayService:
    """Routes sessions to upstream visenv servers; a `SessionService` like `EnvService`."""

    def __init__(
        self,
        upstreams: Sequence[str],
        token: str | None = None,
        timeout: float = 60.0,
        refresh: float = 5.0,
        lost_after: float = 30.0,
        max_request_bytes: int | None = None,
    ) -> None:
        if not upstreams:
            raise ValueError("a gateway needs at least one upstream (host:grpc_port)")
        self.upstream_names = list(upstreams)
        self.token = token
        self.timeout = timeout
        self.refresh = refresh
        self.lost_after = lost_after
        self.max_request_bytes = max_request_bytes  # its own (REST bodies, gRPC messages)
        self.metrics = Metrics()
        self.env_specs: dict[str, EnvSpec] = {}
        # the upstreams, sorted by address; a session's server is named by its id
        self.router: Router[_Server] = Router(locate=self._route, any_server=False)
        self._task: asyncio.Task | None = None
        self._up_gauge = Gauge(
            "visenv_gateway_upstream_up",
            "1 while the upstream answers, 0 while it does not.",
            ["node", "address"],
            registry=self.metrics.registry,
        )
        self._sessions_gauge = Gauge(
            "visenv_gateway_upstream_sessions",
            "Sessions the upstream holds (as last reported, plus those placed since).",
            ["node", "address"],
            registry=self.metrics.registry,
        )
        for name in self.upstream_names:
            node, _, address = name.rpartition("=")
            _split_address(address)  # a malformed name fails now, not at the first refresh
            if node:
                if not re.match(NODE_PATTERN, node):
                    raise ValueError(f"upstream {name!r}: {node!r} is not a node id (a DNS label)")
                self._server(address).pinned = node

    # ---- lifecycle ---------------------------------------------------------------
    async def start(self) -> None:
        await self._discover()
        self._task = asyncio.create_task(self._refresh_loop())

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        await asyncio.gather(
            *(s.transport.aclose() for s in self.router.servers), return_exceptions=True
        )

    async def __aenter__(self) -> GatewayService:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()

    async def _refresh_loop(self) -> None:
        while True:
            await asyncio.sleep(self.refresh)
            try:
                await self._discover()
            except Exception:  # keep refreshing whatever one round ran into
                log.exception("gateway: discovering upstreams failed; retrying")

    # ---- discovery ---------------------------------------------------------------
    def _server(self, address: str) -> _Server:
        server = next((s for s in self.router.servers if s.address == address), None)
        if server is None:
            rpc = GrpcTransport(address, self.token, self.timeout, reply_type=wire.SessionReply)
            rpc.label = f"upstream {address}"
            server = self.router.add(_Server(rpc))
            self.router.servers.sort(key=lambda s: s.address)  # ties go to the first
        return server

    @staticmethod
    async def _resolve(name: str) -> list[str]:
        host, port = _split_address(name)
        try:
            infos = await asyncio.get_running_loop().getaddrinfo(
                host, int(port), type=socket.SOCK_STREAM
            )
        except OSError:
            return []  # not resolvable now (a service still starting): try again later
        hosts = sorted({info[4][0] for info in infos})
        return [f"[{h}]:{port}" if ":" in h else f"{h}:{port}" for h in hosts]

    async def _discover(self) -> None:
        """Resolve every upstream name, then ask every server who it is and what it offers."""
        current: set[str] = set()
        for name in self.upstream_names:
            node, _, address = name.rpartition("=")
            # a pinned upstream keeps its name: its gRPC channel follows the name's address
            current.update([address] if node else await self._resolve(address))
        for address in current:
            self._server(address)
        for server in list(self.router.servers):
            server.resolved = server.address in current
            if not server.resolved and not server.up and self._gone(server):
                await self._drop(server)  # vanished from its name and silent: a removed replica
        await asyncio.gather(*(self._probe(s) for s in list(self.router.servers)))

    async def _probe(self, server: _Server) -> None:
        """Ask `server` its node, boot and load (and, if new, its environments)."""
        try:
            status = await server.transport.status()
            node, boot = str(status.get("node", "")), str(status.get("boot", ""))
            if not node or not boot:
                raise ServiceError("INTERNAL", "its Status names no node and boot (an old server?)")
            if server.pinned and node != server.pinned:
                raise ServiceError(
                    "INTERNAL", f"it says it is node {node!r}, not {server.pinned!r}"
                )
            if boot != server.boot:
                specs = await server.transport.list_envs()
                server.envs = {s.name for s in specs if s.available and s.enabled}
                self._learn(specs)
        except ConnectionFailure:
            self._mark_down(server)
            return
        except (ServiceError, VisenvError) as exc:
            log.error("gateway: upstream %s is not usable: %s", server.address, exc.message)
            self._mark_down(server)
            return
        if server.boot is not None and boot != server.boot:
            log.warning("gateway: upstream %s restarted; its sessions are lost", server.describe())
        if server.labels()[0] != node:  # its gauges were labelled "" until now
            for gauge in (self._up_gauge, self._sessions_gauge):
                with contextlib.suppress(KeyError):
                    gauge.remove(*server.labels())
        server.node, server.boot = node, boot
        server.sessions = int(status.get("sessions", 0))
        server.draining = bool(status.get("draining", False))
        server.limits = status.get("limits") or {}
        server.ready = {str(k): bool(v) for k, v in (status.get("ready") or {}).items()}
        for other in list(self.router.servers):
            if other is not server and other.node == node and not other.up and not other.pinned:
                await self._drop(other)  # the node moved to a new address (a pod re-created)
        self._mark_up(server)

    def _learn(self, specs: list[EnvSpec]) -> None:
        for s in specs:
            known = self.env_specs.get(s.name)
            if s.enabled and (known is None or (s.available and not known.available)):
                self.env_specs[s.name] = s

    async def _drop(self, server: _Server) -> None:
        self.router.remove(server)
        for gauge in (self._up_gauge, self._sessions_gauge):
            with contextlib.suppress(KeyError):
                gauge.remove(*server.labels())
        await server.transport.aclose()

    def _mark_up(self, server: _Server) -> None:
        server.down_since = None
        self._gauges(server)

    def _mark_down(self, server: _Server) -> None:
        if server.down_since is None:
            server.down_since = time.monotonic()
            log.warning("gateway: upstream %s does not answer", server.describe())
        self._gauges(server)

    def _gauges(self, server: _Server) -> None:
        self._up_gauge.labels(*server.labels()).set(1 if server.up else 0)
        self._sessions_gauge.labels(*server.labels()).set(server.sessions)

    def _gone(self, server: _Server) -> bool:
        """Unreachable for longer than `lost_after`: its sessions are taken for lost."""
        down = server.down_since
        return down is not None and time.monotonic() - down > self.lost_after

    # ---- routing (the router's hooks and its calls) --------------------------------
    def _place(self, env: str) -> _Server | ServiceError:
        """The least-loaded upstream that answers and offers `env`, one not draining if
        there is one (if all drain, one of them says so), counted there at once."""
        (where,) = self.router.place([env], [s for s in self.router.servers if s.up])
        if where is not None:
            return where
        if env in self.env_specs or not any(s.up for s in self.router.servers):
            return ServiceError(
                "UNAVAILABLE",
                f"no upstream server can run environment {env!r} now "
                f"(upstreams: {', '.join(self.upstream_names)})",
            )
        unknown = check_env(self.env_specs, env)  # not among them: NOT_FOUND, as a server
        assert unknown is not None
        return unknown

    def _route(self, session_id: str) -> _Server | ServiceError:
        """The router's `locate` hook: the server that holds `session_id`, from the id alone."""
        origin = origin_of(session_id)
        named = [] if origin is None else [s for s in self.router.servers if s.names(origin)]
        if origin is None or not named:
            return unknown_session(session_id)
        for server in named:
            if server.boot == origin.boot:
                return _lost(session_id, server) if self._gone(server) else server
        pending = [s for s in named if s.boot is None]  # pinned, and not reached yet
        return _unreachable(pending[0]) if pending else _lost(session_id, named[0])

    async def _fan_out(self, routed: list[Any], payload: list[Any], call: str) -> list[Any]:
        """Each upstream its items (`payload`, routed by `routed`: a server, or the item's
        answer already) in one batch, by the router; answers in order, as ServiceErrors."""

        async def send(server: _Server, positions: list[int]) -> list[Any]:
            items = [payload[i] for i in positions]
            try:
                answers = await getattr(server.transport, call)(items)
            except ConnectionFailure:  # no answer at all: the upstream is down
                self._mark_down(server)
                error = _unreachable(server)
                if call != "create" and self._gone(server):
                    error = ServiceError(
                        "SESSION_LOST", f"upstream {server.describe()} is gone, with its sessions"
                    )
                return [error] * len(items)
            except VisenvError as exc:
                return [service_error(exc)] * len(items)
            if server.down_since is not None:
                self._mark_up(server)
            answers = [service_error(a) if isinstance(a, VisenvError) else a for a in answers]
            if call != "create" and any(_unknown_session(a) for a in answers):
                answers = await self._restarted(server, items, answers)
            return answers

        return await self.router.fan_out(routed, send)

    async def _restarted(self, server: _Server, payload: list, answers: list) -> list:
        """The upstream does not know some sessions: if it restarted (asked now), they were
        lost with its old process, not closed."""
        await self._probe(server)
        out = []
        for item, answer in zip(payload, answers, strict=True):
            sid = item if isinstance(item, str) else item.session_id
            origin = origin_of(sid)
            if _unknown_session(answer) and origin is not None and origin.boot != server.boot:
                answer = _lost(sid, server)
            out.append(answer)
        return out

    # ---- the SessionService API ---------------------------------------------------
    async def wait_started(self) -> None:
        """Nothing to wait for: a gateway starts (`start`) before it serves."""

    def envs_ready(self) -> dict[str, bool]:
        """Per environment: whether an upstream that offers it answers now."""
        up = set().union(*(s.envs or () for s in self.router.servers if s.up))
        return {name: name in up for name in sorted(self.env_specs)}

    async def list_envs(self) -> list[EnvSpec]:
        return [self.env_specs[n] for n in sorted(self.env_specs)]

    def limits(self) -> dict[str, Any]:
        """The upstreams' limits, the strictest of each (and the gateway's own request
        size); empty while no upstream has answered."""
        out: dict[str, Any] = {}
        for server in self.router.servers:
            for key, value in server.limits.items():
                known = out.get(key)
                if known is None or (isinstance(value, int) and isinstance(known, int)):
                    out[key] = value if known is None else min(known, value)
        if out and self.max_request_bytes is not None:
            out["max_request_bytes"] = min(out["max_request_bytes"], self.max_request_bytes)
        return out

    def _check_batch(self, items: Sequence[Any], field: str = "items") -> None:
        limit = self.limits().get("max_batch_items")
        if limit is not None:
            check_batch(items, limit, field)

    async def create(self, items: Sequence[SessionOptions | Mapping[str, Any]]) -> list[Result]:
        self._check_batch(items)
        routed: list[Any] = []  # a server, or the item's error
        payload: list[Any] = []
        for item in items:
            options = validate(SessionOptions, item)
            if isinstance(options, ServiceError):
                routed.append(options)
                payload.append(None)
            else:  # counted on its server as placed, so that one batch spreads out
                routed.append(self._place(options.env))
                payload.append(
                    wire.from_fields(wire.SessionOptions, options.model_dump(mode="json"))
                )
        results = await self._fan_out(routed, payload, "create")
        for where, result in zip(routed, results, strict=True):
            if isinstance(where, _Server) and not isinstance(result, SessionReply):
                where.sessions -= 1
        return results

    async def _routed(self, model: type, items: Sequence[Any], call: str, make: Any) -> list[Any]:
        """Each item validated as `model`, sent as `make(item)` to the server its session
        id names (the router's `locate`), one batch per upstream."""
        self._check_batch(items)
        routed: list[Any] = []
        payload: list[Any] = []
        for item in items:
            req = validate(model, item)
            routed.append(
                req if isinstance(req, ServiceError) else self.router.locate(req.session_id)
            )
            payload.append(None if isinstance(req, ServiceError) else make(req))
        return await self._fan_out(routed, payload, call)

    async def reset(self, items: Sequence[ResetItem | Mapping[str, Any]]) -> list[Result]:
        return await self._routed(ResetItem, items, "reset", _as(wire.ResetItem))

    async def step(self, items: Sequence[StepItem | Mapping[str, Any]]) -> list[Result]:
        return await self._routed(StepItem, items, "step", _as(wire.StepItem))

    async def get(self, session_ids: Sequence[str]) -> list[Result]:
        return await self._by_id(session_ids, "get")

    async def close(self, session_ids: Sequence[str]) -> list[ServiceError | None]:
        return await self._by_id(session_ids, "close")

    async def _by_id(self, session_ids: Sequence[str], call: str) -> list[Any]:
        self._check_batch(session_ids, "session_ids")
        routed = [self.router.locate(sid) for sid in session_ids]
        return await self._fan_out(routed, list(session_ids), call)

    async def fork(
        self, items: Sequence[ForkItem | Mapping[str, Any]]
    ) -> list[list[SessionReply] | ServiceError]:
        """Forks are made by the source's upstream (on its worker); their ids name it."""
        return await self._routed(ForkItem, items, "fork", _as(wire.ForkItem))

    async def frame(self, session_id: str) -> bytes:
        """The upstream's frame of the session (its Frame RPC: the latest image shown)."""
        routed = [self.router.locate(session_id)]
        result = (await self._fan_out(routed, [session_id], "frame"))[0]
        if isinstance(result, ServiceError):
            raise result
        return result

    async def health(self) -> dict[str, Any]:
        # asked now, not at the last refresh: a client that just closed its sessions reads
        # 0; an upstream that is slow to answer leaves its last known figures
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(
                asyncio.gather(*(self._probe(s) for s in list(self.router.servers))),
                HEALTH_PROBE_SECONDS,
            )
        servers = list(self.router.servers)  # sorted by address
        up = [s for s in servers if s.up]
        envs = sorted(set().union(*(s.envs or () for s in up)))
        now = time.monotonic()
        return {
            "status": "ok" if up else "degraded",
            "role": "gateway",
            # per environment: some upstream that is up serves it without a warm-up
            "ready": {
                e: any(s.ready.get(e, False) for s in up if e in (s.envs or ())) for e in envs
            },
            "limits": self.limits(),
            "sessions": sum(s.sessions for s in up),
            "envs": envs,
            "upstreams": [
                {
                    "address": s.address,
                    "node": s.node or s.pinned,
                    "boot": s.boot,
                    "up": s.up,
                    "down_s": None if s.down_since is None else round(now - s.down_since, 3),
                    "envs": sorted(s.envs or ()),
                    "sessions": s.sessions,
                    "draining": s.draining,
                }
                for s in servers
            ],
        }


def _split_address(name: str) -> tuple[str, str]:
    host, _, port = name.rpartition(":")
    if not host or not port.isdigit():
        raise ValueError(f"upstream {name!r}: write it as host:grpc_port (or NODE=host:grpc_port)")
    return host, port


def _unreachable(server: _Server) -> ServiceError:
    return ServiceError(
        "UNAVAILABLE",
        f"upstream {server.describe()} does not answer now; retry (a step with the same "
        "step_index is never applied twice)",
    )


def _lost(session_id: str, server: _Server) -> ServiceError:
    return ServiceError(
        "SESSION_LOST",
        f"session {session_id!r} was lost with its upstream server's process "
        f"({server.describe()} restarted or is gone)",
    )


def _unknown_session(answer: Any) -> bool:
    return isinstance(answer, ServiceError) and answer.code == "NOT_FOUND"


def _as(request: type[T]) -> Callable[[Any], T]:
    """A validated item as it goes to the upstream: the SDK's `request` of its fields
    (read by attribute name, nested actions alike: `visenv.wire.convert`)."""
    return convert.from_attrs(request)
