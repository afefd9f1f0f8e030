"""examples/trl_grpo_visenv.py: TRL's GRPOTrainer (PyPI trl, on CPU) with
environment_factory over visenv through OpenEnv's client, against a real server."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from conftest import TOKEN, oracle_plan
from transformers.utils import get_json_schema

os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")
import trl_grpo_visenv as example  # noqa: E402  (after the variable trl reads at import)


@pytest.fixture
def tool_env(servers):
    server, _ = servers
    example.VisenvToolEnv.server, example.VisenvToolEnv.env = server.url, "frozenlake"
    example.VisenvToolEnv.token = TOKEN
    env = example.VisenvToolEnv()
    yield env
    env._close()


def test_the_tool_env_plays_an_oracle_episode(servers, tool_env):
    plan = oracle_plan("frozenlake", 7, {"render_mode": "text"})
    text = tool_env.reset(prompt=[{"role": "user", "content": "x"}], seed=7)
    assert "FrozenLake" in text and "G" in text  # render_mode text: the map is in the text
    assert tool_env.observation["ground_truth"] == plan["ground_truths"][0]
    for turn, truth in zip(plan["turns"], plan["ground_truths"][1:], strict=True):
        out = tool_env.move(actions=", ".join(a["name"] for a in turn))  # as TRL calls a tool
        assert "Reward:" in out and tool_env.observation["ground_truth"] == truth
    assert tool_env.done and tool_env.success and tool_env.get_reward() > 0
    with pytest.raises(ValueError, match="over"):
        tool_env.move(actions="Up")
    schema = get_json_schema(example.VisenvToolEnv.move)  # what TRL shows the model
    assert schema["function"]["parameters"]["required"] == ["actions"]


def test_grpo_trainer_runs_a_step_against_the_server(servers, tmp_path: Path):
    server, _ = servers
    before = server.sessions()
    trainer = example.main([
        "--server", server.url, "--env", "frozenlake", "--token", TOKEN, "--tiny",
        "--max-steps", "1", "--batch", "2", "--max-completion-length", "16",
        "--output-dir", str(tmp_path),
    ])  # fmt: skip
    assert trainer.state.global_step == 1
    logged = trainer.state.log_history[0]
    assert "rewards/VisenvToolEnv/mean" in logged and "tools/call_frequency" in logged
    pool = trainer._environment_pool[None]
    assert len(pool) == 2 and all(env.observation["session_id"] for env in pool)
    assert server.sessions() == before + 2  # one server session per rollout
    for env in pool:
        env._close()
    assert server.sessions() == before
