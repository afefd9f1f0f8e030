"""GatewayService: `EnvService`'s interface in front of other visenv servers.

It is what `visenv serve --upstream light:50051 --upstream navigation:50051` runs, and
so what `docker compose up envs` puts on one HTTP and one gRPC port: the REST and gRPC
adapters serve it exactly as they serve `EnvService`; only where sessions live differs.

- Upstreams are named `host:grpc_port`. A name may resolve to many addresses (a compose
  service scaled with `--scale`, a Kubernetes headless Service): every address is one
  upstream server, and names are resolved again every `refresh` seconds, so replicas
  added later take new sessions.
- A new session goes to the least-loaded upstream that offers its environment, and
  stays there: the gateway remembers which upstream holds each session id.
- Steps are passed through with the client's own `step_index`, so a retried step is
  still answered from the upstream's memory, never applied twice.
- An upstream that cannot be reached makes its sessions answer `SESSION_LOST` (they
  are gone with it); the other upstreams' sessions go on.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
from collections import Counter
from collections.abc import Sequence
from typing import Any

from pydantic import BaseModel, ValidationError

from visenv import wire

from .metrics import Metrics
from .models import (
    EnvSpec,
    ForkItem,
    ResetItem,
    ServiceError,
    SessionOptions,
    SessionReply,
    StepItem,
)
from .upstream import Upstream, UpstreamDown

Result = SessionReply | ServiceError
log = logging.getLogger("visenv.gateway")


def _validate(model: type[BaseModel], item: Any, index: int) -> BaseModel | ServiceError:
    if isinstance(item, model):
        return item
    try:
        return model.model_validate(item)
    except ValidationError as exc:
        return ServiceError.from_validation(exc, prefix=f"items.{index}")


class GatewayService:
    """Routes sessions to upstream visenv servers; the API of `EnvService`."""

    def __init__(
        self,
        upstreams: Sequence[str],
        token: str | None = None,
        timeout: float = 60.0,
        refresh: float = 10.0,
    ) -> None:
        if not upstreams:
            raise ValueError("a gateway needs at least one upstream (host:grpc_port)")
        self.upstream_names = list(upstreams)
        self.token = token
        self.timeout = timeout
        self.refresh = refresh
        self.metrics = Metrics()
        self.env_specs: dict[str, EnvSpec] = {}
        self._servers: dict[str, Upstream] = {}  # address -> its gRPC service
        self._offers: dict[str, set[str]] = {}  # address -> envs it can run
        self._load: Counter[str] = Counter()  # address -> sessions placed there
        self._session_server: dict[str, str] = {}  # session id -> address
        self._lost: dict[str, None] = {}  # ids of sessions lost with their upstream (bounded)
        self._task: asyncio.Task | None = None

    # ---- lifecycle ---------------------------------------------------------------
    async def start(self) -> None:
        await self._discover()
        self._task = asyncio.create_task(self._refresh_loop())

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        await asyncio.gather(*(t.aclose() for t in self._servers.values()), return_exceptions=True)

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

    @staticmethod
    async def _resolve(name: str) -> list[str]:
        host, _, port = name.rpartition(":")
        if not host or not port.isdigit():
            raise ValueError(f"upstream {name!r}: write it as host:grpc_port")
        try:
            infos = await asyncio.get_running_loop().getaddrinfo(
                host, int(port), type=socket.SOCK_STREAM
            )
        except OSError:
            return []  # not resolvable now (a service still starting): try again later
        hosts = sorted({info[4][0] for info in infos})
        return [f"[{h}]:{port}" if ":" in h else f"{h}:{port}" for h in hosts]

    async def _discover(self) -> None:
        """Resolve every upstream name; ask new addresses which envs they offer."""
        for name in self.upstream_names:
            for address in await self._resolve(name):
                if address in self._offers:
                    continue
                upstream = self._servers.get(address) or Upstream(address, self.token, self.timeout)
                self._servers[address] = upstream
                try:
                    specs = await upstream.list_envs()
                except (ServiceError, UpstreamDown):
                    continue  # not up yet: asked again at the next refresh
                self._offers[address] = {s.name for s in specs if s.available and s.enabled}
                for s in specs:
                    if not s.enabled:
                        continue
                    known = self.env_specs.get(s.name)
                    if known is None or (s.available and not known.available):
                        self.env_specs[s.name] = s

    # ---- routing -----------------------------------------------------------------
    def _place(self, env: str) -> str | ServiceError:
        candidates = [a for a, envs in self._offers.items() if env in envs]
        if not candidates:
            if env in self.env_specs or not self._offers:
                return ServiceError(
                    "UNAVAILABLE",
                    f"no upstream server can run environment {env!r} now "
                    f"(upstreams: {', '.join(self.upstream_names)})",
                )
            return ServiceError(
                "NOT_FOUND",
                f"unknown environment {env!r}; known: {', '.join(sorted(self.env_specs))}",
                "env",
            )
        return min(candidates, key=lambda a: (self._load[a], a))

    def _server_of(self, session_id: str) -> str | ServiceError:
        address = self._session_server.get(session_id)
        if address is not None:
            return address
        if session_id in self._lost:
            return ServiceError(
                "SESSION_LOST", f"session {session_id!r} was lost with its upstream server"
            )
        return ServiceError("NOT_FOUND", f"unknown session {session_id!r}", "session_id")

    def _upstream_down(self, address: str) -> None:
        """`address` stopped answering: its sessions are lost; it takes no new ones until
        the refresh loop finds it answering again."""
        self._offers.pop(address, None)
        for sid in [s for s, a in self._session_server.items() if a == address]:
            self._forget(sid)
            self._lost[sid] = None
        while len(self._lost) > 100_000:
            del self._lost[next(iter(self._lost))]

    def _forget(self, session_id: str) -> None:
        address = self._session_server.pop(session_id, None)
        if address is not None:
            self._load[address] -= 1

    async def _fan_out(
        self, routed: list[tuple[str | ServiceError, Any]], call: str
    ) -> list[Result | None]:
        """Send each server its items in one batch; answers in the order of `routed`."""
        results: list[Result | None] = [None] * len(routed)
        groups: dict[str, list[int]] = {}
        for i, (where, _) in enumerate(routed):
            if isinstance(where, ServiceError):
                results[i] = where
            else:
                groups.setdefault(where, []).append(i)

        async def one(address: str, indices: list[int]) -> None:
            payload = [routed[i][1] for i in indices]
            try:
                answers = await getattr(self._servers[address], call)(payload)
            except UpstreamDown as exc:
                self._upstream_down(address)
                code = "UNAVAILABLE" if call == "create" else "SESSION_LOST"
                answers = [ServiceError(code, f"upstream {address} is unreachable: {exc}")] * len(
                    indices
                )
            except ServiceError as exc:
                answers = [exc] * len(indices)
            for i, answer in zip(indices, answers, strict=True):
                results[i] = answer

        await asyncio.gather(*(one(a, idx) for a, idx in groups.items()))
        return results

    # ---- the EnvService API ------------------------------------------------------
    async def list_envs(self) -> list[EnvSpec]:
        return [self.env_specs[n] for n in sorted(self.env_specs)]

    async def create(self, items: Sequence[SessionOptions | dict]) -> list[Result]:
        routed: list[tuple[str | ServiceError, Any]] = []
        for i, item in enumerate(items):
            options = _validate(SessionOptions, item, i)
            if isinstance(options, ServiceError):
                routed.append((options, None))
                continue
            where = self._place(options.env)
            if not isinstance(where, ServiceError):
                self._load[where] += 1  # counted now so one batch spreads out
            routed.append((where, wire.SessionOptions(**options.model_dump(mode="json"))))
        results = await self._fan_out(routed, "create")
        for (where, _), result in zip(routed, results, strict=True):
            if isinstance(where, ServiceError):
                continue
            if isinstance(result, SessionReply):
                self._session_server[result.session_id] = where
            else:
                self._load[where] -= 1
        return results  # type: ignore[return-value]

    async def reset(self, items: Sequence[ResetItem | dict]) -> list[Result]:
        routed = []
        for i, item in enumerate(items):
            req = _validate(ResetItem, item, i)
            if isinstance(req, ServiceError):
                routed.append((req, None))
            else:
                item = (req.session_id, req.seed, req.image_encoding)
                routed.append((self._server_of(req.session_id), item))
        return await self._checked(await self._fan_out(routed, "reset"), routed)

    async def step(self, items: Sequence[StepItem | dict]) -> list[Result]:
        routed = []
        for i, item in enumerate(items):
            req = _validate(StepItem, item, i)
            if isinstance(req, ServiceError):
                routed.append((req, None))
                continue
            actions = None
            if req.actions is not None:
                actions = tuple(
                    wire.ActionSpec(a.name, tuple(a.args), a.payload) for a in req.actions
                )
            step = wire.StepItem(
                req.session_id, req.step_index, req.response, actions, req.image_encoding
            )
            routed.append((self._server_of(req.session_id), step))
        return await self._checked(await self._fan_out(routed, "step"), routed)

    async def get(self, session_ids: Sequence[str]) -> list[Result]:
        routed = [(self._server_of(sid), sid) for sid in session_ids]
        return await self._checked(await self._fan_out(routed, "get"), routed)

    async def close(self, session_ids: Sequence[str]) -> list[ServiceError | None]:
        routed = [(self._server_of(sid), sid) for sid in session_ids]
        results = await self._fan_out(routed, "close")
        for sid, result in zip(session_ids, results, strict=True):
            if result is None or (isinstance(result, ServiceError) and result.code != "NOT_FOUND"):
                self._forget(sid)
        return results  # type: ignore[return-value]

    async def fork(
        self, items: Sequence[ForkItem | dict]
    ) -> list[list[SessionReply] | ServiceError]:
        """Forks are made by the source's upstream (on its worker) and stay there."""
        routed: list[tuple[str | ServiceError, Any]] = []
        for i, item in enumerate(items):
            req = _validate(ForkItem, item, i)
            if isinstance(req, ServiceError):
                routed.append((req, None))
            else:
                routed.append((self._server_of(req.session_id), (req.session_id, req.n)))
        results = await self._checked(await self._fan_out(routed, "fork"), routed)
        for (where, _), result in zip(routed, results, strict=True):
            if isinstance(result, list):
                for reply in result:
                    self._session_server[reply.session_id] = where
                    self._load[where] += 1
        return results  # type: ignore[return-value]

    async def _checked(self, results: list[Result | None], routed: list) -> list[Result]:
        """Forget sessions their upstream no longer has (reaped, or lost with a worker)."""
        for (_, item), result in zip(routed, results, strict=True):
            if isinstance(result, ServiceError) and result.code in ("SESSION_LOST", "NOT_FOUND"):
                sid = item if isinstance(item, str) else getattr(item, "session_id", None)
                if sid is None and isinstance(item, tuple):
                    sid = item[0]
                if sid in self._session_server:
                    self._forget(sid)
                    if result.code == "SESSION_LOST":
                        self._lost[sid] = None
        return results  # type: ignore[return-value]

    async def frame(self, session_id: str) -> bytes:
        """The upstream's frame of the session (its Frame RPC: the latest image shown)."""
        # not `_checked`: NOT_FOUND here may mean "no image yet" of a live session
        result = (await self._fan_out([(self._server_of(session_id), session_id)], "frame"))[0]
        if isinstance(result, ServiceError):
            raise result
        return result

    async def health(self) -> dict[str, Any]:
        return {
            "status": "ok",
            "role": "gateway",
            "sessions": len(self._session_server),
            "envs": sorted(set().union(*self._offers.values())),
            "upstreams": [
                {"address": a, "envs": sorted(self._offers.get(a, ())), "sessions": self._load[a]}
                for a in sorted(self._servers)
            ],
        }
