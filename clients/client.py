"""`AsyncEnvClient`: many sessions on one or many visenv servers (its blocking twin,
`EnvClient`, is clients/sync_client.py).

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
import functools
import os
from collections.abc import Awaitable, Callable, Collection, Sequence
from typing import Any, TypeVar

from tenacity import AsyncRetrying, retry_if_exception, stop_after_attempt, wait_exponential

from . import discovery, rollout
from .errors import ConnectionFailure, SessionLost, Unavailable, VisenvError
from .router import RaySet, Router, Server
from .transport import ForkItem, ItemResult, ResetItem, StepItem, Transport, make_transport
from .types import ActionSpec, EnvSpec, SessionOptions, SessionReply

T = TypeVar("T")
TOKEN_ENV_VAR = "VISENV_TOKEN"


def _action_list(n: int, actions: Any) -> tuple[ActionSpec, ...]:
    """Session n's actions as ActionSpecs (a name stands for ActionSpec(name)); a string
    or a lone action where the list belongs is a TypeError that says so."""
    if isinstance(actions, str | ActionSpec):
        raise TypeError(
            f"actions[{n}] must be a list of this session's actions, e.g. [{actions!r}], "
            f"not {type(actions).__name__} {actions!r}"
        )
    out = []
    for action in actions:
        if isinstance(action, str):
            action = ActionSpec(action)
        if not isinstance(action, ActionSpec):
            raise TypeError(f"actions[{n}]: an action is an ActionSpec or a name, not {action!r}")
        out.append(action)
    return tuple(out)


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
        # the servers: a fixed list, or a ray:// set's (`RaySet`: added as they appear, kept
        # while this client may have sessions there); the router remembers which server
        # made each session
        self._router: Router[Server] = Router()
        self._set: RaySet | None = None
        if ray_sets:
            self._set = RaySet(
                ray_sets[0], self._router, self._make, transport == "http", refresh_s, timeout
            )
        for address in [] if ray_sets else addresses:
            self._router.add(Server(self._make(address)))
        self.refresh_s = refresh_s
        self.timeout = timeout
        self.retries = retries
        self.retry_wait = retry_wait
        self._next_step: dict[str, int] = {}  # session id -> step_index of its next step
        # sessions placed on each server by creates still in flight: a server's status,
        # asked at each placement, does not count them yet (concurrent creates of one
        # session each all went to one server)
        self._placing: dict[Server, int] = {}

    # ---- lifecycle ---------------------------------------------------------------
    async def __aenter__(self) -> AsyncEnvClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    async def aclose(self, close_sessions: bool = True) -> None:
        """Close this client's open sessions (best effort) and its connections."""
        if close_sessions and self._router.held:
            try:
                await self.close(list(self._router.held))
            except VisenvError:
                pass
        if self._set is not None:
            self._set.cancel()
        await asyncio.gather(
            *(s.transport.aclose() for s in self._router.servers), return_exceptions=True
        )

    # ---- introspection -----------------------------------------------------------
    @property
    def servers(self) -> list[str]:
        """The servers' addresses (ray://NAME: those the set listed at its last read)."""
        return [s.address for s in self._listed()]

    def _listed(self) -> list[Server]:
        return [s for s in self._router.servers if s.live]

    async def refresh(self) -> list[str]:
        """ray://NAME: read the set again now; answers its servers' addresses (a fixed list
        answers as it is)."""
        if self._set is not None:
            await self._set.refresh()
        return self.servers

    def _stale(self) -> None:
        """A server was lost or refused: read the set again (ray://NAME only)."""
        if self._set is not None:
            self._set.soon()

    async def _open_servers(self) -> list[Server]:
        """The servers new sessions may go to: every one of a fixed list; of a ray:// set,
        its live servers that are not draining (`RaySet.open`)."""
        return list(self._router.servers) if self._set is None else await self._set.open()

    @property
    def session_ids(self) -> list[str]:
        return list(self._router.held)

    def server_of(self, session_id: str) -> str:
        """The address of the server that holds `session_id`."""
        where = self._router.locate(session_id)
        if isinstance(where, Exception):
            raise where
        return where.address

    def next_step_index(self, session_id: str) -> int:
        return self._next_step[session_id]

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
        """One batch per server of the sessions `keys` name, concurrently (the router's
        `fan_out`), each retried as `retries` allows; the per-item results in order."""

        async def send(server: Server, positions: list[int]) -> list[Any]:
            transport, answers = server.transport, {}
            todo = positions
            for attempt in range(self.retries + 1):
                try:
                    out = await self._retrying(lambda sent=todo: call(transport, sent), idempotent)
                except ConnectionFailure as exc:  # retried already: the server is gone
                    out, left = [lost(transport, exc)] * len(todo), []
                except VisenvError as exc:  # the whole call failed (timeout, token)
                    out, left = [exc] * len(todo), []
                else:  # items a gateway could not reach their server for, for a moment
                    left = [
                        p for p, r in zip(todo, out, strict=False)
                        if idempotent and isinstance(r, Unavailable)
                    ]  # fmt: skip
                if len(out) != len(todo):
                    raise VisenvError(
                        f"{transport.address} answered {len(out)} results for {len(todo)} items"
                    )
                answers.update(zip(todo, out, strict=True))
                if not left or attempt == self.retries:
                    break
                # the same items again (a step keeps its step_index, so it is answered from
                # the server's memory if it was applied before the answer was lost)
                todo = left
                await asyncio.sleep(min(2.0, self.retry_wait * 2**attempt))
            return [answers[p] for p in positions]

        return await self._router.fan_out([self._router.locate(k) for k in keys], send)

    def _remember(self, results: list[ItemResult]) -> None:
        for r in results:
            if isinstance(r, SessionReply) and r.session_id in self._router.held:
                self._next_step[r.session_id] = r.step_index

    def _forget_lost(self, ids: Sequence[str], results: list[Any]) -> None:
        for sid, r in zip(ids, results, strict=True):
            if isinstance(r, VisenvError) and r.code in ("SESSION_LOST", "NOT_FOUND"):
                self._router.forget(sid)
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
        if self._set is not None and self._set.looked_at is None:
            await self.refresh()
        held = next((s for s in self._router.servers if s.address == server), None)
        if held is None:
            raise ValueError(f"{server!r} is not one of this client's servers {self.servers}")
        transport = held.transport
        try:
            (reply,) = await self._retrying(lambda: transport.get([session_id]))
        except ConnectionFailure as exc:
            raise self._lost(transport, exc) from None
        if isinstance(reply, VisenvError):
            raise reply
        self._router.hold(session_id, held)
        self._next_step[session_id] = reply.step_index
        return reply

    async def list_envs(self) -> list[EnvSpec]:
        """The environments of the first server that answers."""
        last: Exception | None = None
        for server in await self._open_servers():
            try:
                return await self._retrying(server.transport.list_envs)
            except ConnectionFailure as exc:
                last = exc
        raise Unavailable(f"no server reachable: {last}")

    async def status(self) -> list[dict[str, Any] | VisenvError]:
        """Each server's status (its /health JSON), or the error reaching it, in the order
        of `servers`."""
        if self._set is not None and self._set.looked_at is None:
            await self.refresh()
        return await self._statuses(self._listed())

    async def _statuses(self, servers: list[Server]) -> list[dict[str, Any] | VisenvError]:
        async def one(server: Server) -> dict[str, Any] | VisenvError:
            try:
                return await self._retrying(server.transport.status)
            except ConnectionFailure as exc:
                return Unavailable(str(exc))
            except VisenvError as exc:
                return exc

        return list(await asyncio.gather(*(one(s) for s in servers)))

    async def _place(self, envs: Sequence[str], avoid: Collection[Server] = ()) -> list[Server]:
        """A server for each new session (one per name in `envs`): the router's least
        loaded that is not draining and offers that environment, by the servers' own
        session counts (asked now; over their caps when they report one). Servers that
        don't list their envs take any. `avoid`: servers that just refused, unless no
        other is open. ray://NAME: when none of the servers it knew answers, the set is
        read again."""
        for attempt in range(3 if self._set is not None else 1):
            candidates = await self._open_servers()
            candidates = [s for s in candidates if s not in avoid] or candidates
            if len(candidates) == 1:
                return [candidates[0]] * len(envs)
            try:
                return await self._place_among(candidates, envs)
            except Unavailable:
                if attempt == 2 or self._set is None:
                    raise
                await self._set.now()  # e.g. every one of them restarting: as it is now
        raise AssertionError("unreachable")

    async def _place_among(self, candidates: list[Server], envs: Sequence[str]) -> list[Server]:
        statuses = await self._statuses(candidates)
        mine: dict[Server, int] = {}
        for server in self._router.held.values():
            mine[server] = mine.get(server, 0) + 1
        open_: list[Server] = []
        for server, st in zip(candidates, statuses, strict=True):
            if isinstance(st, VisenvError):
                self._stale()
            else:
                server.learn(st, mine.get(server, 0))
                server.sessions += self._placing.get(server, 0)
                if not server.draining:  # a draining server takes no new sessions
                    open_.append(server)
        if not open_:
            answered = [st for st in statuses if not isinstance(st, Unavailable)]
            if any(isinstance(st, VisenvError) for st in answered):  # e.g. a bad token
                raise next(st for st in answered if isinstance(st, VisenvError))
            if answered:
                raise Unavailable(f"every server is draining among {self.servers}")
            raise Unavailable(f"no server reachable among {self.servers}")
        return self._router.place(envs, open_)  # type: ignore[return-value]

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
        refused: set[Server] = set()  # servers that answered UNAVAILABLE (ray:// only)
        again: set[int] = set()  # positions to send again (ray:// only)

        async def one(sent: list[int], server: Server, batch: list[int]) -> list[Any]:
            positions = [sent[b] for b in batch]  # batch: indices into sent
            try:
                out = await self._retrying(
                    lambda: server.transport.create([items[p] for p in positions]),
                    idempotent=False,
                )
            except ConnectionFailure as exc:
                out = [Unavailable(f"server {server.address}: {exc}")] * len(positions)
                if not exc.sent:
                    again.update(positions)
            except VisenvError as exc:
                out = [exc] * len(positions)
            for pos, r in zip(positions, out, strict=True):
                if isinstance(r, SessionReply):
                    self._router.hold(r.session_id, server)
                    self._next_step[r.session_id] = r.step_index
                elif isinstance(r, Unavailable):  # an item's answer: nothing was made
                    again.add(pos)
                    refused.add(server)
            return out

        for attempt in range(3 if self._set is not None else 1):
            if attempt and self._set is not None:  # ray://: as it is now, less those refusing
                await self._set.now()
            again.clear()
            placement = await self._place([items[p].env for p in todo], refused)
            for server in placement:
                self._placing[server] = self._placing.get(server, 0) + 1
            try:
                answers = await self._router.fan_out(placement, functools.partial(one, todo))
            finally:
                for server in placement:
                    self._placing[server] -= 1
            for pos, answer in zip(todo, answers, strict=True):
                results[pos] = answer
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
            lambda server, pos: server.reset([ResetItem(ids[p], seed_list[p]) for p in pos]),
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
        """Apply explicit actions (manual play: no format or world-model reward): one list
        per session, each action an `ActionSpec` or its name (`[["Left", "Up"]]`)."""
        ids = _as_list(session_ids)
        if len(actions) != len(ids):
            raise ValueError(f"{len(ids)} sessions but {len(actions)} action lists")
        lists = [_action_list(n, a) for n, a in enumerate(actions)]
        return await self._step(
            [StepItem(sid, 0, actions=a) for sid, a in zip(ids, lists, strict=True)],
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
            self._router.forget(sid)
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
            lambda server, pos: server.fork([ForkItem(ids[p], counts[p]) for p in pos]),
            self._lost,
            idempotent=False,
        )
        for sid, result in zip(ids, results, strict=True):
            server = self._router.held.get(sid)
            if isinstance(result, list) and server is not None:
                for reply in result:
                    self._router.hold(reply.session_id, server)
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
