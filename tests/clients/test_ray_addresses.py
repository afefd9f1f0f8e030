"""`servers="ray://NAME"` in the SDK without a Ray cluster: the set as clients/discovery.py
would read it (faked here), and transports that answer from memory. tests/ray runs the same
against real servers on a real multi-node cluster."""

from __future__ import annotations

import asyncio
import sys
import types
from typing import Any

import pytest

from clients import AsyncEnvClient, SessionLost, SessionOptions, discovery
from clients import client as client_module
from clients.discovery import Found
from clients.errors import ConnectionFailure, Unavailable
from clients.types import SessionReply
from visenv.v1 import visenv_pb2 as pb


class FakeServer:
    """A transport that makes sessions in memory; `refuse` answers creates UNAVAILABLE (a
    draining server; `draining` is what its status says), `dead` fails every call as a
    refused connection would."""

    def __init__(self, address: str) -> None:
        self.address, self.sessions = address, set()
        self.refuse = self.draining = self.dead = False

    def _check(self) -> None:
        if self.dead:
            raise ConnectionFailure(f"{self.address}: connection refused", sent=False)

    async def status(self) -> dict[str, Any]:
        self._check()
        return {"sessions": len(self.sessions), "draining": self.draining}

    async def create(self, items: list[SessionOptions]) -> list[Any]:
        self._check()
        if self.refuse:
            return [Unavailable("the server is draining")] * len(items)
        out = []
        for options in items:
            sid = f"{self.address}/{len(self.sessions)}"
            self.sessions.add(sid)
            msg = pb.SessionReply(session_id=sid, env=options.env, step_index=0)
            out.append(SessionReply.from_proto(msg, server=self.address))
        return out

    async def step(self, items: list[Any]) -> list[Any]:
        self._check()
        return [
            SessionReply.from_proto(
                pb.SessionReply(session_id=it.session_id, env="sokoban", step_index=1),
                server=self.address,
            )
            for it in items
        ]

    async def close(self, session_ids: list[str]) -> list[Any]:
        self._check()
        self.sessions -= set(session_ids)
        return [None] * len(session_ids)

    async def aclose(self) -> None:
        pass


@pytest.fixture
def cluster(monkeypatch):
    """The set as discovery answers it now (`cluster.found`), the servers by address, and
    how many times the set was read."""
    state = types.SimpleNamespace(found=[], servers={}, reads=0)

    def ray_servers(name: str, timeout: float = 10.0) -> list[Found]:
        assert name == "envs"
        state.reads += 1
        if not state.found:
            raise discovery.NoServerAnswers("none")
        return list(state.found)

    def make(address: str, *args: Any, **kwargs: Any) -> FakeServer:
        return state.servers.setdefault(address, FakeServer(address))

    monkeypatch.setattr(discovery, "ray_servers", ray_servers)
    monkeypatch.setattr(client_module, "make_transport", make)
    return state


def test_a_ray_address_names_one_set_alone():
    with pytest.raises(ValueError, match="alone"):
        AsyncEnvClient(["ray://envs", "10.0.0.1:50051"])
    with pytest.raises(ValueError, match="RAY_ADDRESS"):
        AsyncEnvClient("ray://10.0.0.1:10001")  # Ray Client's address is not a set's name


def test_new_sessions_go_to_live_servers_that_are_not_draining(cluster):
    cluster.found = [Found("a:1", False), Found("b:1", True)]

    async def run() -> None:
        async with AsyncEnvClient("ray://envs", refresh_s=3600) as client:
            made = await client.create([SessionOptions("sokoban")] * 3)
            assert {client.server_of(r.session_id) for r in made} == {"a:1"}
            assert client.servers == ["a:1", "b:1"]
            # a server added: read when asked (or every refresh_s); the least loaded takes more
            cluster.found = [Found("a:1", False), Found("b:1", True), Found("c:1", False)]
            assert await client.refresh() == ["a:1", "b:1", "c:1"]
            made = await client.create([SessionOptions("sokoban")] * 2)
            assert {client.server_of(r.session_id) for r in made} == {"c:1"}
            # c starts draining between its status and the create: its refusal makes the
            # client read the set at once and go elsewhere, nothing lost
            cluster.servers["c:1"].refuse = True
            cluster.found = [Found("a:1", False), Found("b:1", True), Found("c:1", True)]
            reads = cluster.reads
            made = await client.create([SessionOptions("sokoban")] * 2)
            assert {client.server_of(r.session_id) for r in made} == {"a:1"}
            assert cluster.reads > reads

    asyncio.run(run())


def test_a_lost_server_loses_its_sessions_and_the_set_is_read_again(cluster):
    cluster.found = [Found("a:1", False), Found("b:1", False)]

    async def run() -> None:
        async with AsyncEnvClient("ray://envs", refresh_s=3600, retry_wait=0.01) as client:
            made = await client.create([SessionOptions("sokoban")] * 4)
            ids = [r.session_id for r in made]
            on_a = [i for i in ids if client.server_of(i) == "a:1"]
            assert len(on_a) == 2
            cluster.servers["a:1"].dead = True
            cluster.found = [Found("b:1", False), Found("d:1", False)]  # a's replacement: d
            reads = cluster.reads
            steps = await client.step(ids, ["<answer>Left</answer>"] * 4, return_exceptions=True)
            for sid, result in zip(ids, steps, strict=True):
                assert isinstance(result, SessionLost) == (sid in on_a)
            await asyncio.sleep(0.05)  # the read it started
            assert cluster.reads > reads and client.servers == ["b:1", "d:1"]
            made = await client.create([SessionOptions("sokoban")] * 2)
            assert {client.server_of(r.session_id) for r in made} == {"d:1"}

    asyncio.run(run())


def test_no_server_answering_fails_within_the_timeout(cluster):
    async def run() -> None:
        async with AsyncEnvClient("ray://envs", timeout=1.0) as client:
            with pytest.raises(Unavailable):
                await asyncio.wait_for(client.create(SessionOptions("sokoban")), 5)

    asyncio.run(run())


@pytest.fixture
def fake_verl(monkeypatch):
    """Just enough of verl for clients/verl_agent_loop.py to import (verl is not installed
    here; tests_verl runs the loop under the real one)."""
    module = types.ModuleType("verl.experimental.agent_loop.agent_loop")

    class AgentLoopBase:
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            self.rollout_config = types.SimpleNamespace(response_length=64)

    module.AgentLoopBase = AgentLoopBase
    module.AgentLoopMetrics = type("AgentLoopMetrics", (), {})
    module.AgentLoopOutput = type("AgentLoopOutput", (), {})
    module._agent_loop_registry = {}
    module.register = lambda name: lambda cls: cls
    for name in ("verl", "verl.experimental", "verl.experimental.agent_loop"):
        monkeypatch.setitem(sys.modules, name, types.ModuleType(name))
    monkeypatch.setitem(sys.modules, module.__name__, module)
    monkeypatch.delitem(sys.modules, "clients.verl_agent_loop", raising=False)
    try:
        import clients.verl_agent_loop as loop

        yield loop
    finally:
        sys.modules.pop("clients.verl_agent_loop", None)


def test_the_verl_agent_loop_takes_the_same_string(fake_verl, cluster, monkeypatch):
    monkeypatch.setenv(fake_verl.SERVERS_ENV_VAR, "ray://envs")
    from_env = fake_verl.VisenvAgentLoop()  # servers from $VISENV_SERVERS
    from_config = fake_verl.VisenvAgentLoop(servers="ray://envs")

    async def run() -> None:
        cluster.found = [Found("a:1", False)]
        shared = fake_verl.shared_client(from_config.servers)
        assert fake_verl.shared_client(from_env.servers) is shared  # one client for both
        reply = await shared.create.submit(SessionOptions("sokoban"))
        assert shared.client.server_of(reply.session_id) == "a:1"
        await shared.client.aclose()

    asyncio.run(run())
