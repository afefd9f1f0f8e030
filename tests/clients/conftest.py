"""Real `visenv serve` processes for the client tests, all started at once."""

from __future__ import annotations

import pytest

from env_server.testing.launcher import VisenvServer, launch_servers

TOKEN = "test-token-123"


@pytest.fixture(scope="session")
def two_servers() -> list[VisenvServer]:
    """Two real servers, started at once (they take a while on a busy 2-core machine).
    The first one needs TOKEN; the second needs none (and ignores one that is sent).
    test_server_killed_mid_run kills the second one: it runs last."""
    servers = launch_servers(
        dict(workers=1, envs="sokoban,frozenlake", token=TOKEN),
        dict(workers=1, envs="sokoban,frozenlake"),
    )
    yield servers
    for s in servers:
        s.stop()


@pytest.fixture(scope="session")
def token_server(two_servers: list[VisenvServer]) -> VisenvServer:
    return two_servers[0]


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"
