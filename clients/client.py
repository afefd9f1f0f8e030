"""`AsyncEnvClient` and `EnvClient`: many sessions on one or many visenv servers.

    async with AsyncEnvClient(["10.0.0.1:50051", "10.0.0.2:50051"], token="...") as client:
        replies = await client.create([SessionOptions("sokoban", seed=s) for s in range(64)])
        ids = [r.session_id for r in replies]
        replies = await client.step(ids, ["<answer>Left</answer>"] * 64)
        await client.close(ids)

Sessions are placed across the servers by load (the servers' own session counts,
from their status call) and stay on their server. Every call is one batch per server,
sent concurrently. The client keeps each session's `step_index`, so a step retried
after a lost connection carries the same index and the server answers it from memory
instead of applying it twice. Only connection failures are retried (a bounded number
of times, with exponential back-off); a server that stays unreachable makes its
sessions fail with `SessionLost`. Errors of single items are typed exceptions
(`clients.errors`); batch calls raise the first of them, or return them in place
with `return_exceptions=True`.

`servers="ray://NAME"` is the set of servers `visenv ray up --name NAME` runs on a Ray
cluster (clients/discovery.py, docs/ray.md): the client reads the set when it first
needs it, again every `refresh_s` and at once when a server is lost or refuses new
sessions; new sessions go only to its live servers that are not draining.
"""

from __future__ import annotations

import asyncio
import os
import threading
import time
from collections.abc import Awaitable, Callable, Collection, Coroutine, Sequence
from typing import Any, TypeVar

from tenacity import AsyncRetrying, retry_if_exception, stop_after_attempt, wait_exponential

from . import discovery, rollout
from .errors import ConnectionFailure, NotFound, SessionLost, Unavailable, VisenvError
from .transport import ItemResult, StepItem, Transport, make_transport
from .types import ActionSpec, EnvSpec, SessionOptions, SessionReply

T = TypeVar("T")
TOKEN_ENV_VAR = "VISENV_TOKEN"
LOOK_TIMEOUT = 3.0  # seconds a ray:// set's servers have to answer a look (restarting: later)


def _as_list(x: str | Sequence[str]) -> list[str]:
    return [x] if isinstance(x, str) else list(x)


def _raise_first(results: Sequence[T | VisenvError]) -> list[T]:
    for r in results:
        if isinstance(r, VisenvError):
            raise r
    return list(results)  # type: ignore[arg-type]


class AsyncEnvClient:
    """Async client over HTTP (httpx) or gRPC (grpc.aio).

    servers: one address or many: "host:port" (uses `transport`), "grpc://host:port"
        or "http://host:port"; or, alone, "ray://NAME": the servers of the set NAME on
        the Ray cluster (RAY_ADDRESS, or the one this process is part of; needs ray).
    transport: "grpc" (default) or "http" for bare addresses.
    token: bearer token; defaults to the VISENV_TOKEN environment variable.
    timeout: seconds for any one call to one server.
    grpc_stream: gRPC: send the small calls (a step of a few sessions, ...) over one
        long-lived `Calls` stream, several at a time, instead of a unary call each: the
        same answers at a third of grpc's CPU per call on both ends (an agent loop stepping
        one session gains most). False: a unary call each (e.g. through a proxy that
        does not pass bidirectional streams). A server without `Calls` gets unary calls.
    retries: extra attempts after a connection failure, and of the items of a step, get or
        close that a gateway answered UNAVAILABLE (its server unreachable for a moment;
        a step keeps its step_index, so none is applied twice). 0 disables retrying.
    refresh_s: "ray://NAME": seconds between reads of the set (servers added, restarted
        or drained); a lost server or a refused create reads it at once.

    Make it inside a running event loop (its gRPC channels bind to that loop); the
    sync `EnvClient` takes care of that.
    """

    def __init__(
        self,
        servers: str | Sequence[str],
        *,
        transport: str = "grpc",
        token: str | None = None,
        timeout: float = 60.0,
        retries: int = 3,
        retry_wait: float = 0.1,
        grpc_stream: bool = True,
        refresh_s: float = 10.0,
    ) -> None:
        addresses = _as_list(servers)
        if not addresses:
            raise ValueError("give at least one server address")
        ray_sets = [n for n in map(discovery.set_name, addresses) if n is not None]
        if ray_sets and len(addresses) > 1:
            raise ValueError(
                f"{addresses[0]!r}: a ray://NAME address names a whole set; give it alone"
            )
        token = token if token is not None else os.environ.get(TOKEN_ENV_VAR) or None
        self._make = lambda a: make_transport(a, transport, token, timeout, grpc_stream)
        self._transport_kind = transport
        self._ray_set = ray_sets[0] if ray_sets else None
        # a ray:// set's transports: appended as servers appear, kept (by index) while this
        # client has sessions there; _live: those the set lists now, _draining: of those,
        # the ones that take no new sessions (None: a fixed list, every server is live)
        self._servers: list[Transport] = [] if self._ray_set else [self._make(a) for a in addresses]
        self._live: list[int] | None = [] if self._ray_set else None
        self._draining: set[int] = set()
        self._looked_at: float | None = None  # time.monotonic() of the last read of the set
        self._looking: asyncio.Task[None] | None = None
        self._look_error: VisenvError | None = None
        self.refresh_s = refresh_s
        self.timeout = timeout
        self.retries = retries
        self.retry_wait = retry_wait
        self._server_of: dict[str, int] = {}  # session id -> index in _servers
        self._next_step: dict[str, int] = {}  # session id -> step_index of its next step

    # ---- lifecycle ---------------------------------------------------------------
    async def __aenter__(self) -> AsyncEnvClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    async def aclose(self, close_sessions: bool = True) -> None:
        """Close this client's open sessions (best effort) and its connections."""
        if close_sessions and self._server_of:
            try:
                await self.close(list(self._server_of))
            except VisenvError:
                pass
        if self._looking is not None:
            self._looking.cancel()
        await asyncio.gather(*(s.aclose() for s in self._servers), return_exceptions=True)

    # ---- introspection -----------------------------------------------------------
    @property
    def servers(self) -> list[str]:
        """The servers' addresses (ray://NAME: those the set listed at its last read)."""
        return [self._servers[i].address for i in self._listed()]

    def _listed(self) -> list[int]:
        return list(range(len(self._servers))) if self._live is None else list(self._live)

    # ---- a ray:// set ----------------------------------------------------------------
    async def refresh(self) -> list[str]:
        """ray://NAME: read the set again now; answers its servers' addresses (a fixed list
        answers as it is)."""
        if self._ray_set is not None:
            await self._look_now()
            if self._look_error is not None and not self._live:
                raise self._look_error
        return self.servers

    def _look_soon(self) -> asyncio.Task[None]:
        """Read the set in the background (one read at a time)."""
        if self._looking is None or self._looking.done():
            self._looking = asyncio.get_running_loop().create_task(self._look())
        return self._looking

    async def _look_now(self) -> None:
        await asyncio.shield(self._look_soon())

    def _stale(self) -> None:
        """A server was lost or refused: read the set again (ray://NAME only)."""
        if self._ray_set is not None:
            self._look_soon()

    async def _look(self) -> None:
        assert self._ray_set is not None
        try:
            found = await asyncio.to_thread(discovery.ray_servers, self._ray_set, LOOK_TIMEOUT)
        except discovery.NoServerAnswers as exc:  # all restarting, or none yet: look again
            found, self._look_error = [], exc
        except VisenvError as exc:  # no ray, no cluster: nothing to wait for
            found, self._look_error = [], exc
            self._looked_at = time.monotonic()
            raise
        else:
            self._look_error = None
        self._looked_at = time.monotonic()
        index = {s.address: i for i, s in enumerate(self._servers)}
        live, draining = [], set()
        for f in found:
            address = f.http if self._transport_kind == "http" and f.http else f.address
            if address not in index:
                index[address] = len(self._servers)
                self._servers.append(self._make(address))
            live.append(index[address])
            if f.draining:
                draining.add(index[address])
        self._live, self._draining = sorted(live), draining

    async def _open_servers(self) -> list[int]:
        """Indices of the servers new sessions may go to: every one of a fixed list; of a
        ray:// set, its live servers that are not draining (read again when due; waiting up
        to `timeout` while none is, e.g. its only server restarting)."""
        if self._live is None:
            return list(range(len(self._servers)))
        if self._looked_at is None:
            await self._look_now()
        elif time.monotonic() - self._looked_at > self.refresh_s:
            self._look_soon()
        deadline = time.monotonic() + self.timeout
        while not (open_ := [i for i in self._live if i not in self._draining]):
            looking = self._looking
            if looking is not None and looking.done() and not looking.cancelled():
                if (error := looking.exception()) is not None:  # no ray, no cluster
                    raise error
            if time.monotonic() > deadline:
                raise self._look_error or Unavailable(
                    f"no server of Ray set {self._ray_set!r} takes new sessions (all "
                    "draining or restarting?): visenv ray status --name " + str(self._ray_set)
                )
            await asyncio.sleep(0.5)
            await self._look_now()
        return open_

    @property
    def session_ids(self) -> list[str]:
        return list(self._server_of)

    def server_of(self, session_id: str) -> str:
        """The address of the server that holds `session_id`."""
        return self._servers[self._index_of(session_id)].address

    def next_step_index(self, session_id: str) -> int:
        return self._next_step[session_id]

    def _index_of(self, session_id: str) -> int:
        try:
            return self._server_of[session_id]
        except KeyError:
            raise NotFound(
                f"session {session_id!r} is not open in this client (closed, lost, or made elsewhere: "
                "use attach())"
            ) from None

    # ---- retries -----------------------------------------------------------------
    async def _retrying(self, fn: Callable[[], Awaitable[T]], idempotent: bool = True) -> T:
        """Run fn, retrying connection failures (and, unless idempotent, only those
        where the request surely never reached the server)."""

        def retryable(exc: BaseException) -> bool:
            return isinstance(exc, ConnectionFailure) and (idempotent or not exc.sent)

        try:  # the usual case, without the retry machinery's cost on the hot path
            return await fn()
        except ConnectionFailure as exc:
            if self.retries <= 0 or not retryable(exc):
                raise
        await asyncio.sleep(self.retry_wait)
        async for attempt in AsyncRetrying(
            stop=stop_after_attempt(self.retries),
            wait=wait_exponential(multiplier=self.retry_wait * 2, max=2.0),
            retry=retry_if_exception(retryable),
            reraise=True,
        ):
            with attempt:
                return await fn()
        raise AssertionError("unreachable")

    async def _per_server(
        self,
        keys: Sequence[str],
        call: Callable[[Transport, list[int]], Awaitable[list[Any]]],
        lost: Callable[[Transport, ConnectionFailure], VisenvError],
        idempotent: bool = True,
    ) -> list[Any]:
        """Group items by their session's server, send one batch per server concurrently,
        and put the per-item results back in order."""
        groups: dict[int, list[int]] = {}
        results: list[Any] = [None] * len(keys)
        for i, sid in enumerate(keys):
            try:
                groups.setdefault(self._index_of(sid), []).append(i)
            except VisenvError as exc:
                results[i] = exc

        async def one(server_idx: int, positions: list[int]) -> None:
            server = self._servers[server_idx]
            for attempt in range(self.retries + 1):
                try:
                    out = await self._retrying(
                        lambda sent=positions: call(server, sent), idempotent
                    )
                except ConnectionFailure as exc:  # retried already: the server is gone
                    out, positions_left = [lost(server, exc)] * len(positions), []
                except VisenvError as exc:  # the whole call failed (timeout, token)
                    out, positions_left = [exc] * len(positions), []
                else:  # items a gateway could not reach their server for, for a moment
                    positions_left = [
                        p for p, r in zip(positions, out, strict=False)
                        if idempotent and isinstance(r, Unavailable)
                    ]  # fmt: skip
                if len(out) != len(positions):
                    raise VisenvError(
                        f"{server.address} answered {len(out)} results for {len(positions)} items"
                    )
                for pos, r in zip(positions, out, strict=True):
                    results[pos] = r
                if not positions_left or attempt == self.retries:
                    return
                # the same items again (a step keeps its step_index, so it is answered from
                # the server's memory if it was applied before the answer was lost)
                positions = positions_left
                await asyncio.sleep(min(2.0, self.retry_wait * 2**attempt))

        if len(groups) == 1:  # one server: no tasks to spawn
            ((k, v),) = groups.items()
            await one(k, v)
        else:
            await asyncio.gather(*(one(k, v) for k, v in groups.items()))
        return results

    def _remember(self, results: list[ItemResult]) -> None:
        for r in results:
            if isinstance(r, SessionReply) and r.session_id in self._server_of:
                self._next_step[r.session_id] = r.step_index

    def _forget_lost(self, ids: Sequence[str], results: list[Any]) -> None:
        for sid, r in zip(ids, results, strict=True):
            if isinstance(r, VisenvError) and r.code in ("SESSION_LOST", "NOT_FOUND"):
                self._server_of.pop(sid, None)
                self._next_step.pop(sid, None)
                if r.code == "SESSION_LOST":
                    self._stale()

    def _lost(self, server: Transport, exc: ConnectionFailure) -> VisenvError:
        self._stale()
        return SessionLost(f"server {server.address} unreachable, its sessions are gone: {exc}")

    # ---- calls -------------------------------------------------------------------
    async def attach(self, session_id: str, server: str) -> SessionReply:
        """Take over a session made elsewhere (another client, REST, the play page) on
        `server` (one of this client's addresses); answers its current reply."""
        if self._ray_set is not None and self._looked_at is None:
            await self.refresh()
        try:
            idx = [s.address for s in self._servers].index(server)
        except ValueError:
            raise ValueError(
                f"{server!r} is not one of this client's servers {self.servers}"
            ) from None
        transport = self._servers[idx]
        try:
            (reply,) = await self._retrying(lambda: transport.get([session_id]))
        except ConnectionFailure as exc:
            raise self._lost(transport, exc) from None
        if isinstance(reply, VisenvError):
            raise reply
        self._server_of[session_id] = idx
        self._next_step[session_id] = reply.step_index
        return reply

    async def list_envs(self) -> list[EnvSpec]:
        """The environments of the first server that answers."""
        last: Exception | None = None
        for server in [self._servers[i] for i in await self._open_servers()]:
            try:
                return await self._retrying(server.list_envs)
            except ConnectionFailure as exc:
                last = exc
        raise Unavailable(f"no server reachable: {last}")

    async def status(self) -> list[dict[str, Any] | VisenvError]:
        """Each server's status (its /health JSON), or the error reaching it, in the order
        of `servers`."""
        if self._ray_set is not None and self._looked_at is None:
            await self.refresh()
        return await self._statuses(self._listed())

    async def _statuses(self, indices: list[int]) -> list[dict[str, Any] | VisenvError]:
        async def one(server: Transport) -> dict[str, Any] | VisenvError:
            try:
                return await self._retrying(server.status)
            except ConnectionFailure as exc:
                return Unavailable(str(exc))
            except VisenvError as exc:
                return exc

        return list(await asyncio.gather(*(one(self._servers[i]) for i in indices)))

    async def _place(self, envs: Sequence[str], avoid: Collection[int] = ()) -> list[int]:
        """Server index for each new session (one per name in `envs`): the least loaded
        reachable server that is not draining and offers that environment, by its own
        session count (over its cap when it reports one). Servers that don't list their
        envs take any. `avoid`: servers that just refused, unless no other is open.
        ray://NAME: when none of the servers it knew answers, the set is read again."""
        for attempt in range(3 if self._ray_set is not None else 1):
            candidates = await self._open_servers()
            candidates = [i for i in candidates if i not in avoid] or candidates
            if len(candidates) == 1:
                return [candidates[0]] * len(envs)
            try:
                return await self._place_among(candidates, envs)
            except Unavailable:
                if attempt == 2 or self._ray_set is None:
                    raise
                await self._look_now()  # e.g. every one of them restarting: as it is now
        raise AssertionError("unreachable")

    async def _place_among(self, candidates: list[int], envs: Sequence[str]) -> list[int]:
        statuses = await self._statuses(candidates)
        load: dict[int, float] = {}
        capacity: dict[int, float] = {}
        offers: dict[int, set[str] | None] = {}
        mine = [0] * len(self._servers)
        for idx in self._server_of.values():
            mine[idx] += 1
        for i, st in zip(candidates, statuses, strict=True):
            if isinstance(st, VisenvError):
                self._stale()
                continue
            if st.get("draining"):  # takes no new sessions
                continue
            sessions = st.get("sessions")
            load[i] = float(sessions) if isinstance(sessions, (int, float)) else float(mine[i])
            cap = st.get("max_sessions")
            capacity[i] = float(cap) if isinstance(cap, (int, float)) and cap > 0 else 1.0
            listed = st.get("envs")
            offers[i] = set(listed) if isinstance(listed, list) else None
        if not load:
            answered = [st for st in statuses if not isinstance(st, Unavailable)]
            if any(isinstance(st, VisenvError) for st in answered):  # e.g. a bad token
                raise next(st for st in answered if isinstance(st, VisenvError))
            if answered:
                raise Unavailable(f"every server is draining among {self.servers}")
            raise Unavailable(f"no server reachable among {self.servers}")
        placed = []
        for env in envs:
            able = [i for i in load if offers[i] is None or env in offers[i]] or list(load)
            best = min(able, key=lambda i: (load[i] / capacity[i], i))
            placed.append(best)
            load[best] += 1
        return placed

    async def create(
        self, options: SessionOptions | Sequence[SessionOptions], *, return_exceptions: bool = False
    ) -> list[Any]:
        """Create (and reset) sessions; replies hold each first observation and system prompt.
        ray://NAME: items a server refused with UNAVAILABLE (draining, or unreachable before
        the request was sent: nothing was made) go again to the set's other servers, read
        anew."""
        items = [options] if isinstance(options, SessionOptions) else list(options)
        results: list[Any] = [None] * len(items)
        todo = list(range(len(items)))
        refused: set[int] = set()  # servers that answered UNAVAILABLE (ray:// only)
        again: set[int] = set()  # positions to send again (ray:// only)

        async def one(server_idx: int, positions: list[int]) -> None:
            server = self._servers[server_idx]
            try:
                out = await self._retrying(
                    lambda: server.create([items[p] for p in positions]), idempotent=False
                )
            except ConnectionFailure as exc:
                out = [Unavailable(f"server {server.address}: {exc}")] * len(positions)
                if not exc.sent:
                    again.update(positions)
            except VisenvError as exc:
                out = [exc] * len(positions)
            for pos, r in zip(positions, out, strict=True):
                results[pos] = r
                if isinstance(r, SessionReply):
                    self._server_of[r.session_id] = server_idx
                    self._next_step[r.session_id] = r.step_index
                elif isinstance(r, Unavailable):  # an item's answer: nothing was made
                    again.add(pos)
                    refused.add(server_idx)

        for attempt in range(3 if self._ray_set is not None else 1):
            if attempt:  # ray://: the set as it is now, without those that refused
                await self._look_now()
            again.clear()
            placement = await self._place([items[p].env for p in todo], refused)
            groups: dict[int, list[int]] = {}
            for pos, idx in zip(todo, placement, strict=True):
                groups.setdefault(idx, []).append(pos)
            await asyncio.gather(*(one(k, v) for k, v in groups.items()))
            todo = sorted(again)
            if not todo:
                break
        return results if return_exceptions else _raise_first(results)

    async def reset(
        self,
        session_ids: str | Sequence[str],
        seeds: int | Sequence[int | None] | None = None,
        *,
        return_exceptions: bool = False,
    ) -> list[Any]:
        """Start new episodes; `seeds` None lets each server pick the next seed."""
        ids = _as_list(session_ids)
        if seeds is None or isinstance(seeds, int):
            seeds = [seeds] * len(ids)
        if len(seeds) != len(ids):
            raise ValueError(f"{len(ids)} sessions but {len(seeds)} seeds")
        seed_list = list(seeds)
        results = await self._per_server(
            ids,
            lambda server, pos: server.reset([(ids[p], seed_list[p]) for p in pos]),
            self._lost,
        )
        self._remember(results)
        self._forget_lost(ids, results)
        return results if return_exceptions else _raise_first(results)

    async def step(
        self,
        session_ids: str | Sequence[str],
        responses: str | Sequence[str],
        *,
        return_exceptions: bool = False,
    ) -> list[Any]:
        """Apply one turn (the agent's raw response text) to each session."""
        ids = _as_list(session_ids)
        texts = _as_list(responses)
        if len(texts) != len(ids):
            raise ValueError(f"{len(ids)} sessions but {len(texts)} responses")
        return await self._step(
            [StepItem(sid, 0, response=t) for sid, t in zip(ids, texts, strict=True)],
            return_exceptions,
        )

    async def step_actions(
        self,
        session_ids: str | Sequence[str],
        actions: Sequence[Sequence[ActionSpec]],
        *,
        return_exceptions: bool = False,
    ) -> list[Any]:
        """Apply explicit actions (manual play: no format or world-model reward)."""
        ids = _as_list(session_ids)
        if len(actions) != len(ids):
            raise ValueError(f"{len(ids)} sessions but {len(actions)} action lists")
        return await self._step(
            [StepItem(sid, 0, actions=tuple(a)) for sid, a in zip(ids, actions, strict=True)],
            return_exceptions,
        )

    async def _step(self, items: list[StepItem], return_exceptions: bool) -> list[Any]:
        ids = [it.session_id for it in items]
        # the step_index is fixed here, once, so every retry of this step carries the same one
        items = [
            StepItem(it.session_id, self._next_step.get(it.session_id, 0), it.response, it.actions)
            for it in items
        ]
        results = await self._per_server(
            ids, lambda server, pos: server.step([items[p] for p in pos]), self._lost
        )
        self._remember(results)
        self._forget_lost(ids, results)
        return results if return_exceptions else _raise_first(results)

    async def get(
        self, session_ids: str | Sequence[str], *, return_exceptions: bool = False
    ) -> list[Any]:
        """The last reply of each session (its current observation); applies nothing."""
        ids = _as_list(session_ids)
        results = await self._per_server(
            ids, lambda server, pos: server.get([ids[p] for p in pos]), self._lost
        )
        return results if return_exceptions else _raise_first(results)

    async def frame(
        self, session_ids: str | Sequence[str], *, return_exceptions: bool = False
    ) -> list[Any]:
        """The PNG bytes of the latest image each session showed (what the play page
        draws); NotFound for a session whose observations have all been text."""
        ids = _as_list(session_ids)
        results = await self._per_server(
            ids, lambda server, pos: server.frame([ids[p] for p in pos]), self._lost
        )
        return results if return_exceptions else _raise_first(results)

    async def close(self, session_ids: str | Sequence[str]) -> list[VisenvError | None]:
        """Close sessions; answers None per closed session, or the error (not raised:
        closing a session that is already gone is not worth failing over)."""
        ids = _as_list(session_ids)
        results = await self._per_server(
            ids, lambda server, pos: server.close([ids[p] for p in pos]), self._lost
        )
        for sid in ids:
            self._server_of.pop(sid, None)
            self._next_step.pop(sid, None)
        return results

    async def fork(self, session_id: str, n: int = 1) -> list[SessionReply]:
        """`n` new sessions in the exact state of `session_id`, on its server: their
        replies (the source's last reply under each fork's id; `info["fork"]` says whether
        the copy is exact, or the environment's tolerance). The fork is refused whole
        (e.g. `CapacityError` when n sessions don't fit); that error is raised."""
        (result,) = await self.fork_many([session_id], n, return_exceptions=True)
        if isinstance(result, VisenvError):
            raise result
        return result

    async def fork_many(
        self,
        session_ids: str | Sequence[str],
        n: int | Sequence[int] = 1,
        *,
        return_exceptions: bool = False,
    ) -> list[Any]:
        """Fork many sessions (`n` forks each, or one count per session) in one batch per
        server; answers a list of fork replies per session (or its error, in place with
        `return_exceptions=True`). Not retried once sent: a fork makes sessions."""
        ids = _as_list(session_ids)
        counts = [n] * len(ids) if isinstance(n, int) else list(n)
        if len(counts) != len(ids):
            raise ValueError(f"{len(ids)} sessions but {len(counts)} fork counts")
        results = await self._per_server(
            ids,
            lambda server, pos: server.fork([(ids[p], counts[p]) for p in pos]),
            self._lost,
            idempotent=False,
        )
        for sid, result in zip(ids, results, strict=True):
            server_idx = self._server_of.get(sid)
            if isinstance(result, list) and server_idx is not None:
                for reply in result:
                    self._server_of[reply.session_id] = server_idx
                    self._next_step[reply.session_id] = reply.step_index
        self._forget_lost(ids, results)
        return results if return_exceptions else _raise_first(results)

    async def run_episodes(
        self, policy: Any, env: str, seeds: Sequence[int], **kwargs: Any
    ) -> list[Any]:
        """Run whole episodes in batches; see `clients.rollout.run_episodes`."""
        return await rollout.run_episodes(self, policy, env, seeds, **kwargs)

    async def run_branches(
        self, policy: Any, source: Any, turn: int, n: int, **kwargs: Any
    ) -> list[Any]:
        """n episodes that continue `source` from its turn `turn`; see
        `clients.rollout.run_branches`."""
        return await rollout.run_branches(self, policy, source, turn, n, **kwargs)


class _LoopThread:
    """An event loop running in a daemon thread, for the sync client."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(
            target=self.loop.run_forever, name="visenv-client", daemon=True
        )
        self._thread.start()

    def run(self, coro: Coroutine[Any, Any, T]) -> T:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result()

    def stop(self) -> None:
        """End the loop as `asyncio.run` ends its own: tasks still pending (grpc's own
        task of a call just cancelled, one turn from done) are cancelled and run out
        first, so that closing the loop destroys none ("Task was destroyed but it is
        pending!")."""
        try:
            self.run(_drain())
        finally:
            self.loop.call_soon_threadsafe(self.loop.stop)
            self._thread.join(timeout=5)
            self.loop.close()


async def _drain() -> None:
    """Cancel every other task of the running loop and wait for them to end."""
    tasks = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
    for task in tasks:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)
    await asyncio.get_running_loop().shutdown_asyncgens()


class EnvClient:
    """The blocking twin of `AsyncEnvClient` (same arguments, same methods).

    It runs an AsyncEnvClient on its own event loop in a background thread, so it
    works in scripts, notebooks and inside other event loops alike."""

    def __init__(self, servers: str | Sequence[str], **kwargs: Any) -> None:
        self._loop = _LoopThread()

        async def build() -> AsyncEnvClient:
            client = AsyncEnvClient(servers, **kwargs)
            try:
                await client.refresh()  # ray://NAME: read the set now (a wrong NAME fails here)
            except BaseException:
                await client.aclose()
                raise
            return client

        try:
            self._client = self._loop.run(build())
        except BaseException:
            self._loop.stop()
            raise
        self._closed = False

    def __enter__(self) -> EnvClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close_client()

    def close_client(self, close_sessions: bool = True) -> None:
        """Close this client's sessions and connections, and stop its thread."""
        if not self._closed:
            self._closed = True
            self._loop.run(self._client.aclose(close_sessions))
            self._loop.stop()

    @property
    def servers(self) -> list[str]:
        return self._client.servers

    @property
    def session_ids(self) -> list[str]:
        return self._client.session_ids

    def server_of(self, session_id: str) -> str:
        return self._client.server_of(session_id)

    def refresh(self) -> list[str]:
        """ray://NAME: read the set again now; answers its servers' addresses."""
        return self._loop.run(self._client.refresh())

    def next_step_index(self, session_id: str) -> int:
        return self._client.next_step_index(session_id)

    def attach(self, session_id: str, server: str) -> SessionReply:
        return self._loop.run(self._client.attach(session_id, server))

    def list_envs(self) -> list[EnvSpec]:
        return self._loop.run(self._client.list_envs())

    def status(self) -> list[dict[str, Any] | VisenvError]:
        return self._loop.run(self._client.status())

    def create(self, options: SessionOptions | Sequence[SessionOptions], **kw: Any) -> list[Any]:
        return self._loop.run(self._client.create(options, **kw))

    def reset(self, session_ids: str | Sequence[str], seeds: Any = None, **kw: Any) -> list[Any]:
        return self._loop.run(self._client.reset(session_ids, seeds, **kw))

    def step(
        self, session_ids: str | Sequence[str], responses: str | Sequence[str], **kw: Any
    ) -> list[Any]:
        return self._loop.run(self._client.step(session_ids, responses, **kw))

    def step_actions(
        self, session_ids: str | Sequence[str], actions: Sequence[Sequence[ActionSpec]], **kw: Any
    ) -> list[Any]:
        return self._loop.run(self._client.step_actions(session_ids, actions, **kw))

    def get(self, session_ids: str | Sequence[str], **kw: Any) -> list[Any]:
        return self._loop.run(self._client.get(session_ids, **kw))

    def frame(self, session_ids: str | Sequence[str], **kw: Any) -> list[Any]:
        return self._loop.run(self._client.frame(session_ids, **kw))

    def close(self, session_ids: str | Sequence[str]) -> list[VisenvError | None]:
        return self._loop.run(self._client.close(session_ids))

    def fork(self, session_id: str, n: int = 1) -> list[SessionReply]:
        return self._loop.run(self._client.fork(session_id, n))

    def fork_many(
        self, session_ids: str | Sequence[str], n: int | Sequence[int] = 1, **kw: Any
    ) -> list[Any]:
        return self._loop.run(self._client.fork_many(session_ids, n, **kw))

    def run_episodes(self, policy: Any, env: str, seeds: Sequence[int], **kwargs: Any) -> list[Any]:
        """Run whole episodes in batches; see `clients.rollout.run_episodes`."""
        return self._loop.run(self._client.run_episodes(policy, env, seeds, **kwargs))

    def run_branches(self, policy: Any, source: Any, turn: int, n: int, **kwargs: Any) -> list[Any]:
        """n episodes that continue `source` from its turn `turn`; see
        `clients.rollout.run_branches`."""
        return self._loop.run(self._client.run_branches(policy, source, turn, n, **kwargs))
