"""The gymnasium adapter over one remote session passes gymnasium's own checker."""

from __future__ import annotations

import gymnasium
import numpy as np
import pytest
from gymnasium.utils.env_checker import check_env

from clients.gym_env import GYM_ID, RemoteEnv
from tests.clients.conftest import TOKEN


@pytest.mark.parametrize(
    ("env_name", "action_mode", "transport"),
    [("sokoban", "discrete", "grpc"), ("frozenlake", "text", "http")],
)
def test_remote_env_passes_check_env(token_server, env_name, action_mode, transport):
    address = token_server.grpc if transport == "grpc" else token_server.http
    env = gymnasium.make(GYM_ID, server=address, env=env_name, action_mode=action_mode,
                         transport=transport, token=TOKEN, format="no_think",
                         render_mode="rgb_array").unwrapped  # fmt: skip
    assert isinstance(env, RemoteEnv)
    try:
        check_env(env, skip_render_check=False)
        obs, info = env.reset(seed=4)
        assert obs["image"].shape == env.observation_space["image"].shape
        assert "<image>" in obs["text"] and info["system_prompt"] and info["ground_truth"]
        action = 2 if action_mode == "discrete" else "<answer>Down</answer>"
        obs2, reward, terminated, truncated, info2 = env.step(action)
        assert isinstance(reward, float) and set(info2["reward_parts"]) >= {"env", "format"}
        assert info2["actions_executed"] >= 0 and "action_valid" in info2
        again, _ = env.reset(seed=4)
        assert np.array_equal(again["image"], obs["image"]) and again["text"] == obs["text"]
        assert np.array_equal(env.render(), obs["image"])
    finally:
        env.close()


def test_discrete_mode_needs_discrete_actions(token_server):
    # sokoban is discrete: fine; an unknown env is refused before any session is made
    with pytest.raises(ValueError, match="unknown environment"):
        RemoteEnv(token_server.grpc, "no-such-env", token=TOKEN)
