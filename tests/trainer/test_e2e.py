"""End to end: PPO on the tiny Qwen2.5-VL against a real `visenv serve` over gRPC.

Two iterations (finite losses, weights change, a checkpoint reloads to the same
outputs), resume without repeating or skipping an iteration, and lost sessions that
are run again or dropped, never trained on as zero reward.
"""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
import torch

from clients import EnvClient
from clients.episodes import read_episodes
from trainer.config import load_config
from trainer.model import load_policy
from trainer.ppo import latest_checkpoint, train
from trainer.rollout import HFPolicy, collect
from trainer.trajectory import ChatLayout, EpisodeTokens, collate

EXAMPLE = "examples/train_sokoban_tiny.yaml"
pytestmark = pytest.mark.slow


def _config(server, model_path, out_dir, iterations):
    return load_config(EXAMPLE, [
        f"env.servers=['{server.grpc}']",
        "env.max_turns=2",
        f"model.path='{model_path}'",
        "model.build_tiny=false",
        f"run.out_dir='{out_dir}'",
        "run.progress=false",
        f"ppo.iterations={iterations}",
        "ppo.episodes_per_iteration=4",
        "ppo.minibatch_size=2",
        "ppo.entropy_coef=0.01",
        "generation.max_new_tokens=8",
    ])  # fmt: skip


def _probe_logits(model, layout, image_token_id):
    ep = EpisodeTokens()
    layout.system(ep, "probe")
    layout.user(ep, "look: <image>", [np.arange(48 * 48 * 3, dtype=np.uint8).reshape(48, 48, 3)])
    layout.response(ep, layout.tok("<answer>Left</answer>", add_special_tokens=False).input_ids)
    ep.turn_rewards = [0.0]
    batch = collate([ep], layout.pad_id, image_token_id)
    with torch.no_grad():
        return model(**batch.model_inputs(), use_cache=False).logits


def test_ppo_runs_checkpoints_and_resumes(visenv_server, tiny_model_path, tmp_path):
    out = tmp_path / "run"
    initial, processing = load_policy(tiny_model_path)
    result = train(_config(visenv_server, tiny_model_path, out, iterations=2))

    assert [m["iteration"] for m in result.history] == [0, 1]
    for m in result.history:
        assert m["episodes"] == 4 and m["episodes_dropped"] == 0
        for key in (
            "policy_loss",
            "value_loss",
            "entropy",
            "kl",
            "reward",
            "success",
            "steps_per_second",
        ):
            assert math.isfinite(m[key]), key
    trained = result.models.actor
    changed = [
        n for n, p in trained.named_parameters() if not torch.equal(p, initial.state_dict()[n])
    ]
    assert changed, "no actor weight changed"

    # the checkpoint reloads into a fresh model that answers exactly like the trained one
    ckpt = latest_checkpoint(out)
    assert ckpt is not None and ckpt.name == "iter-000001.pt"
    fresh, _ = load_policy(tiny_model_path)
    fresh.load_state_dict(torch.load(ckpt, weights_only=False)["actor"])
    layout = ChatLayout(processing)
    image_id = result.models.image_token_id
    torch.testing.assert_close(
        _probe_logits(fresh, layout, image_id), _probe_logits(trained, layout, image_id)
    )
    assert not torch.allclose(
        _probe_logits(initial, layout, image_id), _probe_logits(trained, layout, image_id)
    )
    assert (out / "learning_curves.png").stat().st_size > 0
    # sampled episodes, in the episode-file format the play page opens
    for it in (0, 1):
        saved = list(read_episodes(out / "episodes" / f"iter-{it:06d}.jsonl"))
        assert len(saved) == 4 and {e["iteration"] for e in saved} == {it}
        assert all(e["steps"] and e["steps"][0]["response"] for e in saved)
    assert any((out / "tensorboard").iterdir())

    # resume: a longer run continues at iteration 2
    again = train(_config(visenv_server, tiny_model_path, out, iterations=3))
    assert [m["iteration"] for m in again.history] == [0, 1, 2]
    assert (
        again.history[:2]
        == [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()][:2]
    )

    # a run killed before its last checkpoint was written redoes exactly that iteration
    latest_checkpoint(out).unlink()
    redo = train(_config(visenv_server, tiny_model_path, out, iterations=3))
    assert [m["iteration"] for m in redo.history] == [0, 1, 2]
    lines = (out / "metrics.jsonl").read_text().splitlines()
    assert [json.loads(line)["iteration"] for line in lines] == [0, 1, 2]


class _ExitOnFirstAttempt(HFPolicy):
    """Answers `Exit` for seed 1 in the first attempt: the tiny env then kills its worker,
    so the session (and any other on that worker) is lost."""

    attempts = 0

    def __call__(self, batch):
        texts = super().__call__(batch)
        if _ExitOnFirstAttempt.attempts == 1:
            texts = [
                "<answer>Exit</answer>" if inp.seed == 1 else t
                for inp, t in zip(batch, texts, strict=True)
            ]
        return texts


@pytest.mark.parametrize("max_attempts", [1, 4])
def test_lost_sessions_are_run_again_or_dropped(start_visenv_server, tiny_model_path, max_attempts):
    server = start_visenv_server(workers=1, envs="tiny")
    model, processing = load_policy(tiny_model_path)
    layout = ChatLayout(processing)
    _ExitOnFirstAttempt.attempts = 0

    def make_policy():
        _ExitOnFirstAttempt.attempts += 1
        return _ExitOnFirstAttempt(model, layout, temperature=0.7, max_new_tokens=4, batch_size=4)

    with EnvClient(server.grpc, transport="grpc", retries=1) as client:
        got = collect(client, make_policy, "tiny", [0, 1, 2], max_attempts=max_attempts, retry_wait=0.5,
                      format="no_think", max_turns=2, progress=False)  # fmt: skip
    # one worker: all three sessions die with it in the first attempt
    assert got.dropped + got.retried >= 1
    if max_attempts == 1:
        assert got.retried == 0 and got.dropped >= 1
    else:
        assert got.dropped == 0 and got.retried >= 1 and len(got.episodes) == 3
    for ep, traj in zip(got.episodes, got.trajectories, strict=True):
        assert traj.ok and ep.n_turns == len(traj.turns) == len(ep.turn_rewards)
        assert all(t.response != "<answer>Exit</answer>" for t in traj.turns)


def test_grpo_with_the_filter_runs_without_a_critic(visenv_server, tiny_model_path, tmp_path):
    cfg = load_config(EXAMPLE, [
        f"env.servers=['{visenv_server.grpc}']", "env.max_turns=1",
        f"model.path='{tiny_model_path}'", "model.build_tiny=false",
        f"run.out_dir='{tmp_path / 'grpo'}'", "run.progress=false",
        "ppo.iterations=1", "ppo.episodes_per_iteration=4", "ppo.group_size=2",
        "ppo.estimator=grpo", "ppo.filter_ratio=0.5", "ppo.kl_estimator=k3",
        "generation.max_new_tokens=8",
    ])  # fmt: skip
    result = train(cfg)
    m = result.history[0]
    assert result.models.critic is None
    assert m["groups"] == 2 and m["groups_kept"] == 1 and len(m["group_reward_std"]) == 2
    assert "value_loss" not in m and "grad_norm_critic" not in m
    assert math.isfinite(m["kl_loss"]) and m["kl_loss"] >= 0  # k3 is never negative
    state = torch.load(latest_checkpoint(tmp_path / "grpo"), weights_only=False)
    assert "critic" not in state and set(state["optimizers"]) == {"actor"}
