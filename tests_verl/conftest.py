"""Fixtures of the verl tests. They run in their own venv (`make verl-test`: verl 0.9 from
PyPI, which pins transformers < 5.11) and drive a real `visenv serve` started from the MAIN
venv (VISENV_PYTHON, default ../.venv/bin/python), as the compat tests do (their launcher).

verl's own `AgentLoopWorker` is built from verl's own trainer config (hydra, ppo_trainer)
with the agent loop's entry in an agent-loop config file, as a verl run builds it; its
server manager is `tiny_model.HFServerManager` (the tiny Qwen2.5-VL on CPU).
"""

from __future__ import annotations

from pathlib import Path

import pytest
import verl
import yaml
from hydra import compose, initialize_config_dir
from tiny_model import HFServerManager, build_model_folder

from tests_compat.conftest import PYTHON, TOKEN, Server, spawn, wait_ready

__all__ = ["TOKEN", "Server", "spawn", "wait_ready", "worker_config"]

VERL_CONFIG = Path(verl.__file__).parent / "trainer" / "config"
PROMPT_LENGTH, RESPONSE_LENGTH = 2048, 1024


@pytest.fixture(scope="session")
def model_path(tmp_path_factory) -> Path:
    return build_model_folder(tmp_path_factory.mktemp("tiny-qwen"))


@pytest.fixture(scope="session")
def server() -> Server:
    """sokoban and frozenlake, one worker."""
    if not Path(PYTHON).exists():
        raise RuntimeError(f"the main venv's python {PYTHON} is missing: run `make setup`")
    server = spawn("--workers", "1", "--envs", "sokoban,frozenlake")
    try:
        yield wait_ready(server)
    finally:
        server.stop()


def worker_config(model_path: Path, folder: Path, **loop: object):
    """verl's trainer config with the `visenv` entry (`loop`: its options) in an
    agent-loop config file, for the tiny model."""
    entry = {"name": "visenv", "_target_": "clients.verl_agent_loop.VisenvAgentLoop",
             "token": TOKEN, **loop}  # fmt: skip
    agents = folder / "agent_loops.yaml"
    agents.write_text(yaml.safe_dump([entry]))
    with initialize_config_dir(config_dir=str(VERL_CONFIG), version_base=None):
        return compose(
            "ppo_trainer",
            overrides=[
                f"actor_rollout_ref.model.path={model_path}",
                "actor_rollout_ref.model.trust_remote_code=true",  # tests_verl/tiny_processor.py
                "actor_rollout_ref.rollout.name=vllm",  # not started: generation is the manager's
                f"actor_rollout_ref.rollout.prompt_length={PROMPT_LENGTH}",
                f"actor_rollout_ref.rollout.response_length={RESPONSE_LENGTH}",
                "actor_rollout_ref.rollout.calculate_log_probs=true",
                f"actor_rollout_ref.rollout.agent.agent_loop_config_path={agents}",
                "actor_rollout_ref.rollout.agent.default_agent_loop=visenv",
                f"data.max_prompt_length={PROMPT_LENGTH}",
            ],
        )


@pytest.fixture
def manager(model_path) -> HFServerManager:
    return HFServerManager(model_path)
