"""Same config and seed on the same machine: the same numbers. Two short PPO runs
against a real `visenv serve`, one in this process and one in a fresh `python -m
trainer.cli` process (another hash seed), give identical metrics and identical weights;
another seed gives other numbers."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import yaml

from trainer.config import load_config
from trainer.ppo import latest_checkpoint, train

pytestmark = pytest.mark.slow
ROOT = Path(__file__).resolve().parents[2]
TIMINGS = {"rollout_seconds", "iteration_seconds", "steps_per_second"}


def _config(server, model_path) -> dict:
    env = {"size": 4, "render_mode": "text", "text_as": "natural", "max_turns": 2}
    return {
        "env": {"servers": [server.grpc], "name": "frozenlake", "format": "no_think",
                "config": env, "max_turns": 2},
        "model": {"path": str(model_path), "critic": "head"},
        "generation": {"max_new_tokens": 8, "temperature": 1.0},
        "ppo": {"iterations": 2, "episodes_per_iteration": 8, "group_size": 2,
                "minibatch_size": 4, "epochs": 2, "actor_lr": 1e-3, "critic_lr": 1e-2},
        "run": {"threads": 1, "progress": False},
    }  # fmt: skip


def _numbers(out: Path) -> tuple[list[dict], dict[str, torch.Tensor]]:
    lines = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    metrics = [{k: v for k, v in m.items() if k not in TIMINGS} for m in lines]
    weights = torch.load(latest_checkpoint(out), weights_only=False)["actor"]
    return metrics, weights


def test_two_runs_with_the_same_seed_give_the_same_numbers(visenv_server, tiny_model_path,
                                                           tmp_path):  # fmt: skip
    config = tmp_path / "run.yaml"
    config.write_text(yaml.safe_dump(_config(visenv_server, tiny_model_path)))
    train(load_config(config, [f"run.out_dir='{tmp_path / 'a'}'"]))
    env = os.environ | {"PYTHONHASHSEED": "7", "PYTHONPATH": str(ROOT)}
    subprocess.run([sys.executable, "-m", "trainer.cli", str(config),
                    f"run.out_dir='{tmp_path / 'b'}'"], cwd=ROOT, env=env, check=True,
                   capture_output=True, timeout=600)  # fmt: skip
    metrics_a, weights_a = _numbers(tmp_path / "a")
    metrics_b, weights_b = _numbers(tmp_path / "b")
    assert len(metrics_a) == 2 and metrics_a == metrics_b  # every metric, to the last bit
    assert weights_a.keys() == weights_b.keys()
    assert all(torch.equal(weights_a[k], weights_b[k]) for k in weights_a)
    # the numbers do depend on the seed (the levels and the samples)
    train(load_config(config, [f"run.out_dir='{tmp_path / 'c'}'", "run.seed=1",
                               "ppo.iterations=1"]))  # fmt: skip
    metrics_c, _ = _numbers(tmp_path / "c")
    assert metrics_c[0] != metrics_a[0]
