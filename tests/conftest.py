"""Shared fixtures: a real `visenv serve` subprocess on ephemeral 127.0.0.1 ports
(env_server/testing/launcher.py starts it).

    def test_x(visenv_server):                 # one shared server for the session
        httpx.get(visenv_server.url + "/health")

    def test_y(start_visenv_server):           # a server of your own (stopped afterwards)
        server = start_visenv_server(workers=1, max_sessions=3, token="t")

Servers also offer the test-only `tiny` environment (`env_server.testing.TinyEnv`).
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable, Iterator

import pytest

from env_server.testing.launcher import VisenvServer, launch_server


@contextlib.contextmanager
def serve_app(app) -> Iterator[str]:
    """Serve an ASGI app (a test double of a remote service, e.g. an OpenAI-style chat
    endpoint) with uvicorn in a thread on an ephemeral 127.0.0.1 port; yields its URL."""
    import uvicorn

    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=0, log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 20
    while not (server.started and server.servers):
        assert time.monotonic() < deadline, "the test server did not start"
        time.sleep(0.02)
    port = server.servers[0].sockets[0].getsockname()[1]
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(10)


@pytest.fixture(scope="session")
def visenv_server() -> Iterator[VisenvServer]:
    """One shared server (2 workers; sokoban, frozenlake, tiny) for the whole session."""
    server = launch_server()
    yield server
    server.stop()


@pytest.fixture
def start_visenv_server() -> Iterator[Callable[..., VisenvServer]]:
    """A factory of servers of your own; each is stopped when the test ends."""
    started: list[VisenvServer] = []

    def start(**kwargs) -> VisenvServer:
        server = launch_server(**kwargs)
        started.append(server)
        return server

    yield start
    for server in started:
        server.stop()
