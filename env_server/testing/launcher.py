"""Start a real `visenv serve` subprocess on ephemeral 127.0.0.1 ports and read its banner:
the one launcher of the tests (tests/conftest.py) and the benches (bench/).

    server = launch_server(workers=1, envs="sokoban")   # waits until it is warm
    httpx.get(server.url + "/health")
    server.stop()

The server runs in its own process group (`stop` and `kill` end its workers too), with its
output collected in `server.output`.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

import httpx

from env_server.testing.tiny_env import TINY_PATH

ROOT = Path(__file__).resolve().parents[2]  # the repository: the server's cwd
SERVING = re.compile(r"visenv serving: HTTP (http://[\d.]+:\d+)\s+gRPC ([\d.]+:\d+)?")
TINY = json.dumps({"tiny": TINY_PATH})  # VISENV_ENV_PATHS of a test server

# how far `launch_server` waits: the banner only, until /health answers at all, or until
# /health says the service has started and warmed
Ready = Literal["banner", "answers", "warm"]


@dataclass
class VisenvServer:
    proc: subprocess.Popen
    url: str  # "http://127.0.0.1:port"
    grpc: str | None  # "127.0.0.1:port"
    token: str | None
    output: list[str] = field(default_factory=list)
    banner_s: float = 0.0  # seconds from the start to the banner line

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
    """Start `visenv serve --port 0 --grpc-port 0` and wait until it is ready.

    Keywords: workers (2; None: the server's default), envs ("sokoban,frozenlake,tiny";
    None: every one available), token, idle_timeout, max_sessions, max_request_bytes,
    upstreams (gateway mode), args (more command-line flags), extra_env (VISENV_* settings,
    e.g. an image's ENV; flags given here win), timeout (90 s, to ready), ready ("warm",
    "answers" or "banner"), cwd (the checkout to serve; the repository's own by default),
    inherit_env (False: the server sees no VISENV_* variable of this process, and offers
    the test-only `tiny` environment; True: this process's environment as it is),
    die_with_parent (the server is killed when the thread that started it ends: an owner
    that may itself be killed, e.g. a Ray actor, leaves no server behind; Linux)."""
    return launch_servers(kwargs)[0]


def launch_servers(*configs: dict) -> list[VisenvServer]:
    """Start one server per keyword dict of `launch_server`, all at once (start-up takes
    a while on a busy machine), and wait until each is ready."""
    spawned = [_spawn(**config) for config in configs]
    servers = []
    try:
        for proc, lines, found, token, started, timeout, ready in spawned:
            deadline = time.monotonic() + timeout
            servers.append(_wait_ready(proc, lines, found, token, started, deadline, ready))
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
    args: list[str] | tuple[str, ...] = (),
    extra_env: dict[str, str] | None = None,
    timeout: float = 90.0,
    ready: Ready = "warm",
    cwd: Path = ROOT,
    inherit_env: bool = False,
    die_with_parent: bool = False,
):
    if inherit_env:
        env = dict(os.environ)
    else:
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
    cmd += list(args)
    started = time.monotonic()
    proc = subprocess.Popen(
        cmd, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        start_new_session=True, preexec_fn=_die_with_parent if die_with_parent else None,
    )  # fmt: skip
    lines: list[str] = []
    found: list[tuple[re.Match, float]] = []

    def read() -> None:
        assert proc.stdout is not None
        for line in proc.stdout:
            lines.append(line)
            match = SERVING.search(line)
            if match and not found:
                found.append((match, time.monotonic()))

    threading.Thread(target=read, daemon=True).start()
    return proc, lines, found, token, started, timeout, ready


def _die_with_parent() -> None:
    """In the child before exec: SIGKILL when the parent goes (prctl PR_SET_PDEATHSIG)."""
    import ctypes

    ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)


def _wait_ready(proc, lines, found, token, started, deadline, ready) -> VisenvServer:
    while not found:
        if proc.poll() is not None or time.monotonic() > deadline:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
            raise RuntimeError("visenv serve did not start:\n" + "".join(lines))
        time.sleep(0.05)
    match, banner_at = found[0]
    server = VisenvServer(proc, match[1], match[2], token, lines, banner_at - started)
    if ready == "banner":
        return server
    while True:  # the socket listens already; wait until the service answers (and warmed)
        try:
            health = httpx.get(server.url + "/health", timeout=2)
            if health.status_code == 200 and (
                ready == "answers" or health.json()["status"] not in ("starting", "warming")
            ):
                return server
        except httpx.HTTPError:
            pass
        if time.monotonic() > deadline:
            server.stop()
            raise RuntimeError("visenv serve never answered /health:\n" + "".join(lines))
        time.sleep(0.05)
