"""The `visenv` command line: serve refuses bad setups clearly; envs lists availability."""

from __future__ import annotations

import socket
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def visenv(*args: str, timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "visenv_cli", *args],
        cwd=ROOT, capture_output=True, text=True, timeout=timeout,
    )  # fmt: skip


def test_envs_lists_each_environment_with_availability():
    out = visenv("envs")
    assert out.returncode == 0, out.stderr
    lines = {line.split()[0]: line for line in out.stdout.splitlines() if line.strip()}
    assert {"sokoban", "frozenlake", "navigation", "primitive_skill", "svg"} <= set(lines)
    assert "available" in lines["sokoban"].split()[1]


def test_serve_help_names_every_option():
    out = visenv("serve", "--help")
    assert out.returncode == 0
    for flag in ("--host", "--port", "--grpc-port", "--workers", "--envs", "--idle-timeout",
                 "--max-sessions", "--token"):  # fmt: skip
        assert flag in out.stdout


def test_serve_refuses_an_unknown_env_and_a_busy_port():
    out = visenv("serve", "--port", "0", "--grpc-port", "0", "--workers", "1", "--envs", "chess")
    assert out.returncode == 1 and "unknown environment(s) ['chess']" in out.stderr
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen(1)
        port = str(busy.getsockname()[1])
        out = visenv("serve", "--port", port, "--grpc-port", "0", "--workers", "1",
                     "--envs", "sokoban")  # fmt: skip
    assert out.returncode == 1 and "visenv serve:" in out.stderr
