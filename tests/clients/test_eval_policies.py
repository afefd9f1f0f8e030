"""`visenv eval --policy random|oracle` needs no model endpoint: run as a user would (a
subprocess, its output piped) against a real server, it prints progress lines, the
summary and where it wrote the episodes."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from clients.episodes import read_episodes

ROOT = Path(__file__).resolve().parents[2]


def visenv_eval(server, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "visenv_cli", "eval", "--server", server.grpc, *args],
        cwd=ROOT, capture_output=True, text=True, timeout=300,
    )  # fmt: skip


def test_random_policy_without_a_model_endpoint(visenv_server, tmp_path) -> None:
    out = tmp_path / "random.jsonl"
    proc = visenv_eval(visenv_server, "--policy", "random", "--env", "sokoban",
                       "--episodes", "3", "--out", str(out))  # fmt: skip
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert f"wrote 3 episodes to {out}" in proc.stdout
    assert "sokoban: random (3 episodes)" in proc.stdout
    # piped: progress as lines, not a terminal's bar
    lines = proc.stderr.splitlines()
    assert lines[0] == "sokoban: 0/3 episodes done, 3 playing, turn 0", proc.stderr
    assert lines[-1] == "sokoban: 3/3 episodes done, 0 playing", proc.stderr
    episodes = list(read_episodes(out))
    assert len(episodes) == 3 and all(e["ok"] for e in episodes)
    assert all(s["response"].startswith("<answer>") for e in episodes for s in e["steps"])


def test_oracle_policy_solves_every_level(visenv_server, tmp_path) -> None:
    out = tmp_path / "oracle.jsonl"
    proc = visenv_eval(visenv_server, "--policy", "oracle", "--env", "frozenlake",
                       "--episodes", "3", "--out", str(out))  # fmt: skip
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert f"wrote 3 episodes to {out}" in proc.stdout
    episodes = list(read_episodes(out))
    assert len(episodes) == 3 and all(e["success"] for e in episodes), proc.stdout


def test_openai_policy_says_what_it_needs(visenv_server) -> None:
    proc = visenv_eval(visenv_server, "--env", "sokoban", "--episodes", "1")
    assert proc.returncode == 2
    assert "--policy openai needs --endpoint and --model" in proc.stderr
    proc = visenv_eval(visenv_server, "--policy", "random", "--format", "free_think")
    assert proc.returncode == 2 and "answers in no_think" in proc.stderr
