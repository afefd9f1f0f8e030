"""Which server gets a new session, which server holds a session, and one batch per server.

The SDK's `AsyncEnvClient` and the gateway (env_server/service/gateway.py) both route
sessions over a set of visenv servers with this one `Router`:

- the set: every `Server` it knows, each `live` (answering, or listed by a ray:// set)
  or not, and `draining` (it takes no new sessions) or not;
- `place`: a new session goes to the least loaded server (its sessions over its
  capacity) that offers its environment, preferring those that are not draining; the
  ones placed in one batch are counted as they go, so the batch spreads out;
- `locate`: the server that holds a session id. By default, the router remembers the
  server that made each session (`hold`: the SDK); a gateway, which keeps no session
  state, gives the `locate` hook instead, reading the server from the id itself
  (session_ids.py: the id names its node and boot);
- `fan_out`: a batch split into one call per server, sent concurrently, its answers
  put back in the batch's order.

`RaySet` keeps a router's set as a ray://NAME set lists it (the SDK's `servers="ray://NAME"`).

How a server's load is known is the caller's: the SDK asks the servers' status before it
places, the gateway probes its upstreams every few seconds.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

from . import discovery
from .errors import NotFound, Unavailable, VisenvError
from .transport import Transport

LOOK_TIMEOUT = 3.0  # seconds a ray:// set's servers have to answer a look (restarting: later)


@dataclass(eq=False)
class Server:
    """One server as the router sees it."""

    transport: Transport
    live: bool = True  # answering (or listed by its set) now
    draining: bool = False  # takes no new sessions
    sessions: float = 0.0  # its load as last known, plus the sessions placed since
    capacity: float = 1.0  # its max_sessions where it says (the load is sessions / capacity)
    envs: set[str] | None = None  # the environments it offers; None: it did not say

    @property
    def address(self) -> str:
        return self.transport.address

    def learn(self, status: dict[str, Any], held: int = 0) -> None:
        """Its load and environments as its status (/health JSON) says: `sessions` (else
        the `held` this client knows of), `max_sessions`, `envs`, `draining`."""
        sessions, cap = status.get("sessions"), status.get("max_sessions")
        listed = status.get("envs")
        self.sessions = float(sessions) if isinstance(sessions, int | float) else float(held)
        self.capacity = float(cap) if isinstance(cap, int | float) and cap > 0 else 1.0
        self.envs = set(listed) if isinstance(listed, list) else None
        self.draining = bool(status.get("draining"))


S = TypeVar("S", bound=Server)


class Router(Generic[S]):
    """Routes sessions over a set of servers (module docstring).

    locate: the hook that names a session's server from its id alone (a gateway); None:
        the server that made it, as `hold` remembered it (the SDK).
    any_server: where no server offers an environment, place it on the least loaded
        anyway (it answers NOT_FOUND itself: the SDK); False: `place` answers None for it
        (a gateway, which knows every upstream's environments, answers for them).
    """

    def __init__(
        self,
        locate: Callable[[str], S | Exception] | None = None,
        any_server: bool = True,
    ) -> None:
        self.servers: list[S] = []
        self.held: dict[str, S] = {}  # session id -> its server (without `locate`)
        self._locate = locate
        self.any_server = any_server

    # ---- the set -------------------------------------------------------------------
    def add(self, server: S) -> S:
        self.servers.append(server)
        return server

    def remove(self, server: S) -> None:
        self.servers.remove(server)

    def open(self) -> list[S]:
        """The servers that take new sessions now: live and not draining."""
        return [s for s in self.servers if s.live and not s.draining]

    # ---- new sessions -------------------------------------------------------------
    def place(self, envs: Sequence[str], among: Sequence[S] | None = None) -> list[S | None]:
        """A server for each new session (one per environment name in `envs`), among
        `among` (default: `open()`); each is counted on its server at once. None: no
        server offers that environment (with `any_server` False)."""
        among = list(self.open() if among is None else among)
        rank = {id(s): i for i, s in enumerate(self.servers)}
        placed: list[S | None] = []
        for env in envs:
            able = [s for s in among if s.envs is None or env in s.envs]
            if not able and self.any_server:
                able = among
            if not able:
                placed.append(None)
                continue
            best = min(
                able, key=lambda s: (s.draining, s.sessions / s.capacity, rank.get(id(s), 0))
            )
            best.sessions += 1
            placed.append(best)
        return placed

    # ---- sessions made ---------------------------------------------------------------
    def hold(self, session_id: str, server: S) -> None:
        """Remember that `server` holds `session_id` (without a `locate` hook)."""
        self.held[session_id] = server

    def forget(self, session_id: str) -> None:
        self.held.pop(session_id, None)

    def locate(self, session_id: str) -> S | Exception:
        """The server that holds `session_id`, or why none does (NotFound by default)."""
        if self._locate is not None:
            return self._locate(session_id)
        server = self.held.get(session_id)
        if server is None:
            return NotFound(
                f"session {session_id!r} is not open in this client (closed, lost, or made "
                "elsewhere: use attach())"
            )
        return server

    # ---- one batch per server ---------------------------------------------------------
    async def fan_out(
        self,
        routed: Sequence[S | Any],
        send: Callable[[S, list[int]], Awaitable[list[Any]]],
    ) -> list[Any]:
        """Each item's answer, in order: `routed` names each item's server (or holds the
        item's answer already, e.g. the error `locate` gave); `send(server, positions)`
        answers that server's items, one per position, in their order."""
        results: list[Any] = [None] * len(routed)
        groups: dict[S, list[int]] = {}
        for i, where in enumerate(routed):
            if isinstance(where, Server):
                groups.setdefault(where, []).append(i)  # type: ignore[arg-type]
            else:
                results[i] = where

        async def one(server: S, positions: list[int]) -> None:
            answers = await send(server, positions)
            if len(answers) != len(positions):
                raise VisenvError(
                    f"{server.address} answered {len(answers)} results for {len(positions)} items"
                )
            for position, answer in zip(positions, answers, strict=True):
                results[position] = answer

        if len(groups) == 1:  # one server: no tasks to spawn
            ((server, positions),) = groups.items()
            await one(server, positions)
        else:
            await asyncio.gather(*(one(s, p) for s, p in groups.items()))
        return results


class RaySet:
    """The servers of the ray://NAME set as a router's set: each server the set lists is
    added (a transport made by `make`) and `live`, `draining` as the set says; one it no
    longer lists stays (its sessions may still be there), not live. The set is read when
    first needed, again when `refresh_s` have passed, and soon after `stale()` (a server
    lost or refusing)."""

    def __init__(
        self,
        name: str,
        router: Router[Server],
        make: Callable[[str], Transport],
        http: bool,
        refresh_s: float,
        timeout: float,
    ) -> None:
        self.name = name
        self.router = router
        self.make = make
        self.http = http  # the servers' HTTP addresses, not their gRPC ones
        self.refresh_s = refresh_s
        self.timeout = timeout
        self.looked_at: float | None = None  # time.monotonic() of the last read
        self.error: VisenvError | None = None  # why the last read found nothing
        self._looking: asyncio.Task[None] | None = None

    async def refresh(self) -> None:
        """Read the set now; raises why when it lists no server."""
        await self.now()
        if self.error is not None and not any(s.live for s in self.router.servers):
            raise self.error

    def soon(self) -> asyncio.Task[None]:
        """Read the set in the background (one read at a time)."""
        if self._looking is None or self._looking.done():
            self._looking = asyncio.get_running_loop().create_task(self._look())
        return self._looking

    async def now(self) -> None:
        await asyncio.shield(self.soon())

    def cancel(self) -> None:
        if self._looking is not None:
            self._looking.cancel()

    async def _look(self) -> None:
        try:
            found = await asyncio.to_thread(discovery.ray_servers, self.name, LOOK_TIMEOUT)
        except discovery.NoServerAnswers as exc:  # all restarting, or none yet: look again
            found, self.error = [], exc
        except VisenvError as exc:  # no ray, no cluster: nothing to wait for
            found, self.error = [], exc
            self.looked_at = time.monotonic()
            raise
        else:
            self.error = None
        self.looked_at = time.monotonic()
        known = {s.address: s for s in self.router.servers}
        listed = set()
        for f in found:
            address = f.http if self.http and f.http else f.address
            if address not in known:
                known[address] = self.router.add(Server(self.make(address)))
            known[address].draining = bool(f.draining)
            listed.add(known[address])
        for server in self.router.servers:
            server.live = server in listed

    async def open(self) -> list[Server]:
        """The set's live servers that are not draining (the set read again when due;
        waiting up to `timeout` while there is none, e.g. its only server restarting)."""
        if self.looked_at is None:
            await self.now()
        elif time.monotonic() - self.looked_at > self.refresh_s:
            self.soon()
        deadline = time.monotonic() + self.timeout
        while not (open_ := self.router.open()):
            looking = self._looking
            if looking is not None and looking.done() and not looking.cancelled():
                if (error := looking.exception()) is not None:  # no ray, no cluster
                    raise error
            if time.monotonic() > deadline:
                raise self.error or Unavailable(
                    f"no server of Ray set {self.name!r} takes new sessions (all draining "
                    f"or restarting?): visenv ray status --name {self.name}"
                )
            await asyncio.sleep(0.5)
            await self.now()
        return open_
