"""Shared fixtures: a real `visenv serve` subprocess on ephemeral 127.0.0.1 ports.

    def test_x(visenv_server):                 # one shared server for the session
        httpx.get(visenv_server.url + "/health")

    def test_y(start_visenv_server):           # a server of your own (stopped afterwards)
        server = start_visenv_server(workers=1, max_sessions=3, token="t")

Servers also offer the test-only `tiny` environment (`env_server.testing.TinyEnv`).
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import pytest

ROOT = Path(__file__).resolve().parents[1]
SERVING = re.compile(r"visenv serving: HTTP (http://[\d.]+:\d+)\s+gRPC ([\d.]+:\d+)?")
TINY = '{"tiny": "env_server.testing:TinyEnv"}'


@dataclass
class VisenvServer:
    proc: subprocess.Popen
    url: str  # "http://127.0.0.1:port"
    grpc: str | None  # "127.0.0.1:port"
    token: str | None
    output: list[str] = field(default_factory=list)

    @property
    def headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.token}"} if self.token else {}

    @property
    def http(self) -> str:
        """The HTTP address without its scheme: "127.0.0.1:port"."""
        return self.url.split("://", 1)[1]

    @property
    def alive(self) -> bool:
        return self.proc.poll() is None

    def client(self, **kwargs) -> httpx.Client:
        return httpx.Client(base_url=self.url, headers=self.headers, timeout=30, **kwargs)

    def kill(self) -> None:
        """SIGKILL the server and its worker processes (its own process group)."""
        if self.alive:
            os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait(timeout=10)

    def stop(self) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(timeout=10)


def launch_server(**kwargs) -> VisenvServer:
    """Start `visenv serve --port 0 --grpc-port 0` and wait until /health answers.

    Keywords: workers (2; None: the server's default), envs ("sokoban,frozenlake,tiny";
    None: every one available), token, idle_timeout, max_sessions, max_request_bytes,
    upstreams (gateway mode), extra_env (VISENV_* settings, e.g. an image's ENV; flags
    given here win), timeout (90 s)."""
    return launch_servers(kwargs)[0]


def launch_servers(*configs: dict) -> list[VisenvServer]:
    """Start one server per keyword dict of `launch_server`, all at once (start-up takes
    a while on a busy 2-core machine), and wait until each answers /health."""
    spawned = [_spawn(**config) for config in configs]
    servers = []
    try:
        for proc, lines, found, token, timeout in spawned:
            servers.append(_wait_ready(proc, lines, found, token, time.monotonic() + timeout))
    except BaseException:
        for proc, *_ in spawned:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
        raise
    return servers


def _spawn(
    *,
    workers: int | None = 2,
    envs: str | None = "sokoban,frozenlake,tiny",
    token: str | None = None,
    idle_timeout: float | None = None,
    max_sessions: int | None = None,
    max_request_bytes: int | None = None,
    upstreams: list[str] | None = None,
    extra_env: dict[str, str] | None = None,
    timeout: float = 90.0,
):
    env = {k: v for k, v in os.environ.items() if not k.startswith("VISENV_")}
    env["VISENV_ENV_PATHS"] = TINY
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")])
    env.update(extra_env or {})
    if max_request_bytes is not None:
        env["VISENV_MAX_REQUEST_BYTES"] = str(max_request_bytes)
    cmd = [sys.executable, "-m", "visenv_cli", "serve", "--host", "127.0.0.1", "--port", "0",
           "--grpc-port", "0"]  # fmt: skip
    for flag, value in (("--workers", workers), ("--envs", envs), ("--token", token),
                        ("--idle-timeout", idle_timeout),
                        ("--max-sessions", max_sessions)):  # fmt: skip
        if value is not None:
            cmd += [flag, str(value)]
    for upstream in upstreams or ():
        cmd += ["--upstream", upstream]
    proc = subprocess.Popen(
        cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        start_new_session=True,
    )  # fmt: skip
    lines: list[str] = []
    found: list[re.Match] = []

    def read() -> None:
        assert proc.stdout is not None
        for line in proc.stdout:
            lines.append(line)
            match = SERVING.search(line)
            if match and not found:
                found.append(match)

    threading.Thread(target=read, daemon=True).start()
    return proc, lines, found, token, timeout


def _wait_ready(proc, lines, found, token, deadline) -> VisenvServer:
    while not found:
        if proc.poll() is not None or time.monotonic() > deadline:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
            raise RuntimeError("visenv serve did not start:\n" + "".join(lines))
        time.sleep(0.05)
    server = VisenvServer(proc, found[0][1], found[0][2], token, lines)
    while True:  # the socket listens already; wait until the service has started and warmed
        try:
            health = httpx.get(server.url + "/health", timeout=2)
            if health.status_code == 200 and health.json()["status"] not in (
                "starting",
                "warming",
            ):
                return server
        except httpx.HTTPError:
            pass
        if time.monotonic() > deadline:
            server.stop()
            raise RuntimeError("visenv serve never answered /health:\n" + "".join(lines))
        time.sleep(0.05)


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
