"""Sampling and training agree: the cached batched sampler gives the same tokens as
`model.generate`, and every sampled token's log-prob is the one the update computes
teacher-forced (same temperature, same special tokens removed)."""

from __future__ import annotations

import pytest
import torch

from clients.rollout import PolicyInput
from clients.types import Observation
from trainer.model import load_policy
from trainer.rollout import HFPolicy
from trainer.trajectory import ChatLayout, collate, policy_forward

TEXTS = ["The goal is below the player.", "A hole is to the left.", "Turn", "x " * 9]


@pytest.fixture(scope="module")
def policy(tiny_model_path):
    model, processing = load_policy(tiny_model_path)
    return model.eval(), ChatLayout(processing)


def _play(policy: HFPolicy, episodes: int = 5, turns: int = 3) -> None:
    """Turns of `episodes` episodes with observations of different lengths; one episode
    leaves after the first turn (its cache row is dropped)."""
    live = list(range(episodes))
    for turn in range(turns):
        batch = [
            PolicyInput(
                episode=e,
                seed=e,
                turn=turn,
                system_prompt=f"You play level {e}.",
                observation=Observation(TEXTS[(e + turn) % len(TEXTS)], (), {}),
                history=[],
            )  # fmt: skip
            for e in live
        ]
        policy(batch)
        if turn == 0:
            live = live[1:]


def _teacher_forced(model, layout, policy: HFPolicy, temperature: float, suppressed):
    keys = sorted(policy.episodes)
    image_id = policy.image_token_id
    batch = collate([policy.episodes[k] for k in keys], layout.pad_id, image_id)
    with torch.no_grad():
        logp = policy_forward(model, batch, temperature, suppressed=suppressed).logp
    sampled = torch.tensor([x for k in keys for turn in policy.logprobs[k] for x in turn])
    return logp[batch.loss_mask.bool()], sampled


def test_sampled_logprobs_equal_the_updates_teacher_forced_ones(policy):
    model, layout = policy
    torch.manual_seed(0)
    sampler = HFPolicy(model, layout, temperature=0.7, max_new_tokens=6, batch_size=8)
    _play(sampler)
    forced, sampled = _teacher_forced(model, layout, sampler, 0.7, layout.suppressed)
    assert len(sampled) == len(forced) > 20
    torch.testing.assert_close(forced, sampled, atol=2e-5, rtol=1e-5)
    # without the suppression the update would see another distribution (a random
    # model gives the special tokens some mass)
    unsuppressed, _ = _teacher_forced(model, layout, sampler, 0.7, ())
    assert (sampled - unsuppressed).abs().max() > 1e-3
    # and sampling never gives a suppressed token
    generated = [t for ep in sampler.episodes.values()
                 for t, m in zip(ep.input_ids, ep.loss_mask, strict=True) if m]  # fmt: skip
    assert not set(generated) & set(layout.suppressed)


def test_the_cache_answers_as_model_generate_does(policy):
    model, layout = policy
    cached = HFPolicy(model, layout, temperature=1.0, max_new_tokens=6, batch_size=8,
                      greedy=True)  # fmt: skip
    plain = HFPolicy(model, layout, temperature=1.0, max_new_tokens=6, batch_size=8,
                     greedy=True, kv_cache=False)  # fmt: skip
    for policy in (cached, plain):
        _play(policy)
        # a new episode joins one that goes on (as when run_episodes refills a slot): its
        # row starts empty, with more new tokens than the other row
        policy([PolicyInput(episode=1, seed=1, turn=3, system_prompt="",
                            observation=Observation("Go.", (), {}), history=[]),
                PolicyInput(episode=9, seed=9, turn=0, system_prompt="A new level.",
                            observation=Observation(TEXTS[0], (), {}), history=[])])  # fmt: skip
    assert cached.episodes.keys() == plain.episodes.keys()
    for k in cached.episodes:
        assert cached.episodes[k].input_ids == plain.episodes[k].input_ids
    assert plain.logprobs == {}  # only the cache keeps them
