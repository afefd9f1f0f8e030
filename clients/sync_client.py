"""`EnvClient`: the blocking twin of `AsyncEnvClient` (clients/client.py), on an event loop
of its own in a background thread."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Coroutine, Sequence
from typing import Any, TypeVar

from .client import AsyncEnvClient
from .errors import VisenvError
from .types import ActionSpec, EnvSpec, SessionOptions, SessionReply

T = TypeVar("T")


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
