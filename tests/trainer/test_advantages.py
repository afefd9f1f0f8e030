"""Advantage estimators: hand-computed examples, and vectorised == loop on random inputs."""

from __future__ import annotations

import math

import pytest
import torch

from trainer.advantages import (
    bi_level_gae,
    grpo_advantages,
    masked_gae,
    masked_whiten,
    turn_wise_gae,
)
from trainer.advantages_loop import (
    bi_level_gae_loop,
    grpo_advantages_loop,
    masked_gae_loop,
    turn_wise_gae_loop,
)

T = torch.tensor


def test_masked_gae_by_hand():
    # tokens: obs, act, act, obs, act -- rewards and values on masked tokens are ignored
    rewards = T([[9.0, 1.0, 0.0, 9.0, 2.0]])
    values = T([[5.0, 0.5, 1.0, 7.0, 0.5]])
    mask = T([[0, 1, 1, 0, 1]])
    adv, ret = masked_gae(rewards, values, mask, gamma=0.9, lam=0.5)
    # i=4: 2 - 0.5 = 1.5
    # i=2: 0 + 0.9*0.5 - 1.0 = -0.55; + 0.45*1.5 = 0.125
    # i=1: 1 + 0.9*1.0 - 0.5 = 1.4;   + 0.45*0.125 = 1.45625
    torch.testing.assert_close(adv, T([[0.0, 1.45625, 0.125, 0.0, 1.5]]))
    torch.testing.assert_close(ret, T([[0.0, 1.95625, 1.125, 0.0, 2.0]]))


# one episode of two turns: obs, a, a, a|end, obs, a, a|end
BL_MASK = T([[0, 1, 1, 1, 0, 1, 1]])
BL_END = T([[0, 0, 0, 1, 0, 0, 1]])
BL_REWARDS = T([[0.0, -0.1, -0.1, 1.0, 0.0, -0.1, 2.0]])
BL_VALUES = T([[0.0, 0.2, 0.4, 0.5, 0.0, 0.6, 1.0]])


def test_bi_level_gae_by_hand():
    adv, ret = bi_level_gae(
        BL_REWARDS,
        BL_VALUES,
        BL_MASK,
        BL_END,
        gamma_token=1.0,
        lam_token=0.5,
        gamma_turn=0.5,
        lam_turn=1.0,
    )
    # turns: turn 2: delta = 2 - 1 = 1 -> A2 = 1, G2 = 2
    #        turn 1: delta = 1 + 0.5*1 - 0.5 = 1 -> A1 = 1 + 0.5*1 = 1.5, G1 = 2
    # turn 2 tokens: end: 2 - 1 = 1 (= A2); pos5: -0.1 + 1 - 0.6 = 0.3, + 0.5*1 = 0.8
    # turn 1 tokens: end: 2 - 0.5 = 1.5 (= A1); pos2: -0.1 + 0.5 - 0.4 = 0, + 0.5*1.5 = 0.75
    #                pos1: -0.1 + 0.4 - 0.2 = 0.1, + 0.5*0.75 = 0.475
    torch.testing.assert_close(adv, T([[0.0, 0.475, 0.75, 1.5, 0.0, 0.8, 1.0]]))
    torch.testing.assert_close(ret, T([[0.0, 0.675, 1.15, 2.0, 0.0, 1.4, 2.0]]))


def test_turn_wise_gae_by_hand():
    adv, ret = turn_wise_gae(BL_REWARDS, BL_VALUES, BL_MASK, BL_END, gamma_turn=0.5, lam_turn=1.0)
    torch.testing.assert_close(adv, T([[0.0, 1.5, 1.5, 1.5, 0.0, 1.0, 1.0]]))
    torch.testing.assert_close(ret, T([[0.0, 2.0, 2.0, 2.0, 0.0, 2.0, 2.0]]))


def test_grpo_by_hand():
    rewards = T([1.0, 3.0, 2.0, 2.0, 5.0])
    groups = T([0, 0, 1, 1, 2])
    mask = T([[1, 1, 0]] * 5)
    adv, _ = grpo_advantages(rewards, groups, mask)
    s = 1 / math.sqrt(2)  # group 0: mean 2, unbiased std sqrt(2)
    expected = T([[-s, -s, 0], [s, s, 0], [0, 0, 0], [0, 0, 0], [0, 0, 0]])
    torch.testing.assert_close(adv, expected, atol=1e-5, rtol=0)


def test_turn_end_outside_mask_is_refused():
    with pytest.raises(ValueError, match="turn-end"):
        bi_level_gae(BL_REWARDS, BL_VALUES, T([[0, 1, 1, 0, 0, 1, 1]]), BL_END, 1.0, 1.0, 0.95, 1.0)


def test_shape_mismatch_is_refused():
    with pytest.raises(ValueError, match="shape"):
        masked_gae(BL_REWARDS, BL_VALUES[:, :3], BL_MASK, 1.0, 1.0)


def random_batch(seed: int, batch: int = 6, tokens: int = 60):
    g = torch.Generator().manual_seed(seed)
    mask = (torch.rand(batch, tokens, generator=g) < 0.6).long()
    mask[0] = 0  # a row without action tokens
    ends = (torch.rand(batch, tokens, generator=g) < 0.15).long() * mask
    rewards = torch.randn(batch, tokens, generator=g)
    values = torch.randn(batch, tokens, generator=g)
    return rewards, values, mask, ends


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_vectorised_equals_loop(seed):
    r, v, m, e = random_batch(seed)
    gt, lt, gu, lu = 0.97, 0.9, 0.8, 0.7
    for fast, slow in [
        (masked_gae(r, v, m, gt, lt), masked_gae_loop(r, v, m, gt, lt)),
        (bi_level_gae(r, v, m, e, gt, lt, gu, lu), bi_level_gae_loop(r, v, m, e, gt, lt, gu, lu)),
        (turn_wise_gae(r, v, m, e, gu, lu), turn_wise_gae_loop(r, v, m, e, gu, lu)),
    ]:
        torch.testing.assert_close(fast[0].double(), slow[0], atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(fast[1].double(), slow[1], atol=1e-5, rtol=1e-5)
        assert (fast[0][m == 0] == 0).all()
    g = torch.Generator().manual_seed(seed)
    episode_rewards = torch.randint(0, 3, (m.shape[0],), generator=g).float()
    groups = torch.randint(0, 3, (m.shape[0],), generator=g)
    fast = grpo_advantages(episode_rewards, groups, m)
    slow = grpo_advantages_loop(episode_rewards, groups, m)
    torch.testing.assert_close(fast[0].double(), slow[0], atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(fast[1].double(), slow[1], atol=1e-5, rtol=1e-5)


def test_bi_level_turn_end_advantage_is_turn_advantage():
    r, v, m, e = random_batch(5)
    adv, _ = bi_level_gae(r, v, m, e, 1.0, 1.0, 0.95, 1.0)
    turn_adv, _ = turn_wise_gae(r, v, m, e, 0.95, 1.0)
    ends = e.bool()
    torch.testing.assert_close(adv[ends], turn_adv[ends])


def test_masked_whiten():
    x = T([[1.0, 2.0, 100.0], [3.0, -50.0, 4.0]])
    mask = T([[1, 1, 0], [1, 0, 1]])
    w = masked_whiten(x, mask)
    sel = w[mask.bool()]
    assert abs(float(sel.mean())) < 1e-6
    assert abs(float(sel.var(unbiased=False)) - 1.0) < 1e-4
    assert (w[~mask.bool()] == 0).all()


def test_batch_without_action_tokens_gives_zeros():
    z = torch.zeros(2, 5)
    for adv, ret in (masked_gae(z, z, z, 1.0, 1.0), bi_level_gae(z, z, z, z, 1.0, 1.0, 0.95, 1.0),
                     turn_wise_gae(z, z, z, z, 0.95, 1.0)):  # fmt: skip
        assert adv.shape == ret.shape == (2, 5)
        assert (adv == 0).all() and (ret == 0).all()
