"""Episode token layout: loss mask only on generated tokens, turn ends, image tokens, rewards."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from trainer.model import load_policy
from trainer.trajectory import ChatLayout, EpisodeTokens, collate, policy_forward


@pytest.fixture(scope="module")
def policy(tiny_model_path):
    return load_policy(tiny_model_path)


def test_layout_masks_and_image_tokens(policy):
    model, processing = policy
    layout = ChatLayout(processing)
    tok = processing.tokenizer
    ep = EpisodeTokens()
    layout.system(ep, "You push boxes.")
    layout.user(ep, "Turn 1: <image> what now?", [np.zeros((40, 40, 3), np.uint8)])
    first = tok("<answer>Left</answer>", add_special_tokens=False).input_ids + [layout.im_end_id]
    layout.response(ep, first)
    layout.user(ep, "Turn 2: <image>", [np.full((60, 30, 3), 200, np.uint8)])
    second = tok("<answer>Up", add_special_tokens=False).input_ids  # cut off: no <|im_end|>
    layout.response(ep, second)
    ep.turn_rewards = [0.5, 2.0]

    ids = torch.tensor(ep.input_ids)
    mask = torch.tensor(ep.loss_mask).bool()
    # exactly the generated tokens are in the loss mask, in order
    assert ids[mask].tolist() == first + second
    # each response's last generated token is its turn end
    ends = [i for i, e in enumerate(ep.turn_end) if e]
    assert [ep.input_ids[i] for i in ends] == [first[-1], second[-1]]
    # the cut-off response is closed by scaffolding outside the mask
    assert ep.input_ids[ends[1] + 1] == layout.im_end_id and ep.loss_mask[ends[1] + 1] == 0
    # image tokens: one block per image, of the processor's size, never in the mask
    image_id = tok.convert_tokens_to_ids(processing.image_token)
    n_image = int((ids == image_id).sum())
    assert n_image == sum(int(g.prod()) // 4 for _, g in ep.images) > 0
    assert not mask[ids == image_id].any()
    # rewards sit at the turn ends; VAGEN-Base puts their sum at the last one
    rewards = ep.token_rewards("turn")
    assert [rewards[i] for i in ends] == [0.5, 2.0] and sum(rewards) == 2.5
    assert ep.token_rewards("episode")[ends[1]] == 2.5
    decoded = tok.decode(ep.input_ids)
    assert decoded.startswith(
        "<|im_start|>system\nYou push boxes.<|im_end|>\n<|im_start|>user\nTurn 1: <|vision_start|>"
    )

    # a model pass over the padded batch gives finite log-probs at the action tokens
    short = EpisodeTokens()
    layout.system(short, "Hi")
    layout.user(short, "<image>", [np.zeros((28, 28, 3), np.uint8)])
    layout.response(short, [layout.im_end_id])
    short.turn_rewards = [1.0]
    batch = collate([ep, short], layout.pad_id, image_id)
    assert batch.input_ids.shape == (2, len(ep.input_ids))
    logp, entropy, _, _ = policy_forward(model, batch, temperature=0.7)
    assert torch.isfinite(logp).all() and (logp[batch.loss_mask.bool()] < 0).all()
    # padding does not change a sequence's log-probs
    alone = policy_forward(model, collate([short], layout.pad_id, image_id), temperature=0.7).logp
    n = len(short.input_ids)
    torch.testing.assert_close(logp[1, :n], alone[0], atol=1e-4, rtol=1e-4)


def test_placeholder_count_must_match(policy):
    _, processing = policy
    layout = ChatLayout(processing)
    with pytest.raises(ValueError, match="placeholders"):
        layout.user(EpisodeTokens(), "<image> <image>", [np.zeros((28, 28, 3), np.uint8)])


def test_system_prompt_left_out_of_rollouts_and_updates(tiny_model_path):
    """`env.system_prompt=false` reaches the trainer's layout, and the rollout's episode
    tokens (what the update trains on) then hold no system message: the same tokens
    as with it, less exactly the system segment."""
    from clients.rollout import PolicyInput
    from clients.types import Observation
    from trainer.config import load_config
    from trainer.ppo import build_models
    from trainer.rollout import HFPolicy

    def cfg(*extra: str):
        return load_config(None, ["env.servers=['127.0.0.1:1']", f"model.path='{tiny_model_path}'",
                                  "ppo.kl_coef=0", *extra])  # fmt: skip

    models = build_models(cfg("env.system_prompt=false"), torch.device("cpu"), 0)
    assert models.layout.system_prompt is False
    assert build_models(cfg(), torch.device("cpu"), 0).layout.system_prompt is True

    system = "You play FrozenLake. Answer with one move."
    inp = PolicyInput(episode=0, seed=0, turn=0, system_prompt=system,
                      observation=Observation("The goal is below the player.", (), {}),
                      history=[])  # fmt: skip
    tokens = {}
    for keep in (True, False):
        layout = ChatLayout(models.layout.p, system_prompt=keep)
        policy = HFPolicy(models.actor.eval(), layout, temperature=1.0, max_new_tokens=4,
                          batch_size=1, greedy=True)  # fmt: skip
        policy([inp])
        ep = policy.episodes[0]
        first = ep.loss_mask.index(1)  # the context before the first answer
        tokens[keep] = ep.input_ids[:first]
    tok = models.layout.tok
    segment = tok(f"<|im_start|>system\n{system}<|im_end|>\n", add_special_tokens=False).input_ids
    assert tokens[True] == list(segment) + tokens[False]
    assert tok.decode(tokens[False]).startswith("<|im_start|>user\nThe goal is below")
    assert system not in tok.decode(tokens[False])
