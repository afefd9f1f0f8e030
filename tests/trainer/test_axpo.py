"""AXPO on the tiny Qwen2.5-VL against a real server: all-wrong groups get resampled
branches from a fixed reasoning prefix, and every trained token's log-prob is the
sampling policy's."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from clients import EnvClient
from trainer.axpo import (
    BranchPolicy,
    action_prefix,
    head_of,
    resample_all_wrong,
    response_spans,
)
from trainer.config import ConfigError, load_config
from trainer.model import load_policy
from trainer.ppo import level_seeds, train
from trainer.rollout import HFPolicy, collect
from trainer.trajectory import ChatLayout, EpisodeTokens, collate, policy_forward

EXAMPLE = "examples/train_sokoban_tiny.yaml"
SCRIPTED = ["<think>the box is left</think><answer>Up</answer>",
            "<think>try again</think><answer>Down</answer>"]  # fmt: skip
TEMPERATURE = 0.9


class ScriptedPolicy(HFPolicy):
    """Answers fixed texts (as token ids, so the episodes hold a real reasoning prefix)
    instead of sampling: the source episodes of a test group."""

    def generate(self, episodes: list[EpisodeTokens]) -> list[list[int]]:
        return [
            self.layout.tok(SCRIPTED[ep.n_turns % 2], add_special_tokens=False).input_ids
            + [self.layout.im_end_id]
            for ep in episodes
        ]


@pytest.fixture(scope="module")
def tiny(tiny_model_path):
    model, processing = load_policy(str(tiny_model_path))
    model.eval()
    layout = ChatLayout(processing)
    return model, layout, processing.tokenizer.convert_tokens_to_ids(processing.image_token)


def test_prefix_spans_and_head_of_an_episode(tiny):
    _, layout, _ = tiny
    ep = EpisodeTokens()
    layout.system(ep, "rules")
    image = np.zeros((32, 32, 3), np.uint8)
    for text in SCRIPTED:
        layout.user(ep, "look <image>", [image])
        layout.response(ep, layout.tok(text, add_special_tokens=False).input_ids)
    spans = response_spans(ep)
    assert len(spans) == 2 and all(ep.loss_mask[a:b] == [1] * (b - a) for a, b in spans)
    ids = ep.input_ids[spans[0][0] : spans[0][1]]
    prefix = action_prefix(ids, layout)
    text = layout.tok.decode(prefix, skip_special_tokens=True)
    assert text.startswith("<think>the box is left</think>") and "<answer>" in text
    assert "Up" not in text and len(prefix) < len(ids)
    assert action_prefix(layout.tok("no tag", add_special_tokens=False).input_ids, layout) == []
    head = head_of(ep, 1, layout)
    assert head.n_turns == 1 and sum(head.loss_mask) == 0 and len(head.images) == 1
    layout.user(head, "look <image>", [image])  # the next turn's observation follows
    assert head.input_ids == ep.input_ids[: len(head.input_ids)]


def test_an_all_wrong_group_is_resampled_with_the_sampling_log_probs(visenv_server, tiny):
    model, layout, image_token_id = tiny
    options = dict(format="free_think", max_turns=2, progress=False)
    with EnvClient(visenv_server.grpc) as client:
        collected = collect(
            client, lambda: ScriptedPolicy(model, layout, temperature=TEMPERATURE,
                                           max_new_tokens=6, batch_size=4),
            "sokoban", [7, 7, 8, 8], **options,
        )  # fmt: skip
        assert not any(t.success for t in collected.trajectories)  # Up, Down: all wrong
        torch.manual_seed(0)
        args = dict(model=model, layout=layout, temperature=TEMPERATURE, max_new_tokens=6,
                    batch_size=4)  # fmt: skip
        new, metrics, policies = resample_all_wrong(
            client, collected.episodes, collected.trajectories, args, samples=3,
            temperature=TEMPERATURE, image_token_id=image_token_id, episode_options=options,
        )  # fmt: skip
        assert client.session_ids == []
    assert metrics["axpo_groups_all_wrong"] == 2 and metrics["axpo_groups_resampled"] == 2
    assert metrics["axpo_samples"] == 6 and len(new) == 6
    assert sorted(e.info["seed"] for e in new) == [7, 7, 7, 8, 8, 8]  # joins its group
    for policy, group in zip(policies, (new[:3], new[3:]), strict=True):
        assert isinstance(policy, BranchPolicy) and policy.prefix_ids  # a reasoning prefix
        batch = collate(group, layout.pad_id, image_token_id)
        with torch.no_grad():
            logp = policy_forward(model, batch, TEMPERATURE).logp
        for row, ep in enumerate(group):
            assert ep.n_turns == 2 and len(ep.turn_rewards) == 2
            trained = [float(logp[row, i]) for i, m in enumerate(ep.loss_mask) if m]
            sampled = [x for turn in policy.sampled_logprobs[row] for x in turn]
            assert len(trained) == len(sampled) > 0
            assert np.allclose(trained, sampled, atol=2e-4)
            # the fixed prefix sits right before the first sampled token, not trained
            first = ep.loss_mask.index(1)
            assert ep.input_ids[first - len(policy.prefix_ids) : first] == policy.prefix_ids


def test_ppo_with_axpo_logs_its_resampling(visenv_server, tiny_model_path, tmp_path):
    cfg = load_config(EXAMPLE, [
        f"env.servers=['{visenv_server.grpc}']", "env.max_turns=1",
        f"model.path='{tiny_model_path}'", "model.build_tiny=false",
        f"run.out_dir='{tmp_path / 'axpo'}'", "run.progress=false",
        "ppo.iterations=1", "ppo.episodes_per_iteration=4", "ppo.group_size=2",
        "ppo.estimator=grpo", "ppo.axpo=true", "ppo.axpo_branch=last",
        "generation.max_new_tokens=6",
    ])  # fmt: skip
    m = train(cfg).history[0]
    assert m["axpo_groups_all_wrong"] == m["axpo_groups_resampled"] == 2  # a random model
    assert m["axpo_samples"] == 4 and m["groups"] == 2  # the branches joined their groups
    assert 0 <= m["axpo_groups_gained_success"] <= m["axpo_groups_resampled"]
    with pytest.raises(ConfigError, match="axpo"):
        load_config(EXAMPLE, [f"env.servers=['{visenv_server.grpc}']", "ppo.axpo=true",
                              f"model.path='{tiny_model_path}'"])  # fmt: skip


def test_level_file_picks_the_training_levels(tmp_path):
    from trainer.levels import Level, write_levels

    path = tmp_path / "levels.jsonl"
    write_levels(path, [Level("sokoban", 11, 3, 4, 4), Level("sokoban", 12, 6, 4, 1),
                        Level("sokoban", 13, 8, 4, 2), Level("frozenlake", 14, 2, 4, 1)])  # fmt: skip
    cfg = load_config(EXAMPLE, [
        "env.servers=['x:1']", "model.path='m'", "ppo.episodes_per_iteration=6",
        "ppo.group_size=2", f"ppo.level_file='{path}'", "ppo.level_success_min=0.1",
        "ppo.level_success_max=0.7",
    ])  # fmt: skip
    assert level_seeds(cfg, 0, 0, 1) == [12, 12, 13, 13, 12, 12]
    assert level_seeds(cfg, 1, 0, 1) == [13, 13, 12, 12, 13, 13]
