"""The `visenv` command line: serve refuses bad setups clearly; envs lists availability."""

from __future__ import annotations

import os
import re
import socket
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def visenv(*args: str, timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "visenv_cli", *args],
        cwd=ROOT, capture_output=True, text=True, timeout=timeout,
        env={**os.environ, "COLUMNS": "200", "TERMINAL_WIDTH": "200"},
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
    assert f"127.0.0.1:{port}" in out.stderr and "in use" in out.stderr, out.stderr  # which port


def test_help_summaries_are_whole_sentences_and_flags_take_no_type():
    out = visenv("--help")
    assert out.returncode == 0
    commands = dict(re.findall(r"│ (serve|envs|train|eval|levels) +(.+?) *│", out.stdout))
    assert set(commands) == {"serve", "envs", "train", "eval", "levels"}, out.stdout
    assert all(summary.endswith(".") for summary in commands.values()), commands
    for command in ("", "serve", "eval", "levels"):
        text = visenv(*([command] if command else []), "--help").stdout
        assert "<bool>" not in text, f"visenv {command} --help labels a flag <bool>"
    eval_help = visenv("eval", "--help").stdout
    assert "Sampling temperature" in eval_help
    assert "gRPC address HOST:GRPC_PORT" in eval_help and "http://HOST:PORT for REST" in eval_help
