"""Fixtures of the compat tests. They run in their own venv (`make compat-test`: the
peers' clients, e.g. `openenv`, without visenv) and drive a real `visenv serve` started
from the MAIN venv (VISENV_PYTHON, default ../.venv/bin/python).
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import pytest

ROOT = Path(__file__).resolve().parents[1]
PYTHON = os.environ.get("VISENV_PYTHON", str(ROOT / ".venv" / "bin" / "python"))
SERVING = re.compile(r"visenv serving: HTTP (http://[\d.]+:\d+)")
TOKEN = "compat-token"


@dataclass
class Server:
    proc: subprocess.Popen
    url: str = ""
    lines: list[str] = field(default_factory=list)

    @property
    def headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {TOKEN}"}

    def sessions(self) -> int:
        return httpx.get(self.url + "/health", timeout=10).json()["sessions"]

    def metrics(self) -> str:
        return httpx.get(self.url + "/metrics", headers=self.headers, timeout=10).text

    def stop(self) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(timeout=10)


def spawn(*args: str) -> Server:
    env = {k: v for k, v in os.environ.items() if not k.startswith("VISENV_")}
    cmd = [PYTHON, "-m", "visenv_cli", "serve", "--host", "127.0.0.1", "--port", "0",
           "--grpc-port", "0", "--token", TOKEN, *args]  # fmt: skip
    proc = subprocess.Popen(
        cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        start_new_session=True,
    )  # fmt: skip
    server = Server(proc)

    def read() -> None:
        assert proc.stdout is not None
        for line in proc.stdout:
            server.lines.append(line)
            match = SERVING.search(line)
            if match and not server.url:
                server.url = match[1]

    threading.Thread(target=read, daemon=True).start()
    return server


def wait_ready(server: Server, timeout: float = 420) -> Server:
    """Until /health answers (a worker pre-warms the heavy envs first: minutes when busy)."""
    deadline = time.monotonic() + timeout
    while True:
        if server.url:
            try:
                if httpx.get(server.url + "/health", timeout=2).status_code == 200:
                    return server
            except httpx.HTTPError:
                pass
        if server.proc.poll() is not None or time.monotonic() > deadline:
            server.stop()
            raise RuntimeError("visenv serve did not start:\n" + "".join(server.lines))
        time.sleep(0.1)


@pytest.fixture(scope="session")
def servers():
    """(every environment, 1 worker; sokoban only, 1 worker, a cap of 1 session). One
    worker each: every worker pre-warms navigation and primitive_skill before it is ready."""
    if not Path(PYTHON).exists():
        raise RuntimeError(f"the main venv's python {PYTHON} is missing: run `make setup`")
    big = spawn("--workers", "1")
    small = spawn("--workers", "1", "--envs", "sokoban", "--max-sessions", "1")
    try:
        yield wait_ready(big), wait_ready(small)
    finally:
        big.stop()
        small.stop()


def oracle_plan(env: str, seed: int, config: dict | None = None, vagen_main: bool = False) -> dict:
    """An expert's whole episode, computed by a local copy of the environment in the main
    venv (tests_compat/oracle_plan.py): its turns and the ground truth after each.
    `vagen_main`: `config` is VAGEN main's env_config (translated as /compat/vagen does)."""
    out = subprocess.run(
        [PYTHON, str(ROOT / "tests_compat" / "oracle_plan.py"), env, str(seed),
         json.dumps(config or {}), *(["vagen_main"] if vagen_main else [])],
        cwd=ROOT, capture_output=True, text=True, check=True, timeout=300,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )  # fmt: skip
    return json.loads(out.stdout)
