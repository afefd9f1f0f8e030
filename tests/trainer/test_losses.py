"""PPO losses: masked tokens get exactly zero gradient; clipping (symmetric and
"clip-higher"), loss aggregation and the KL loss work as defined."""

from __future__ import annotations

import math

import pytest
import torch

from trainer.ppo import aggregate, kl_estimate, ppo_losses
from trainer.trajectory import token_logprobs_and_entropy


def _inputs(seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    shape = (3, 10)
    mask = (torch.rand(shape, generator=g) < 0.5).float()
    mask[0, 0] = 1
    return dict(
        old_logp=-torch.rand(shape, generator=g),
        advantages=torch.randn(shape, generator=g),
        old_values=torch.randn(shape, generator=g),
        returns=torch.randn(shape, generator=g),
        mask=mask,
    )


def test_masked_tokens_get_exactly_zero_gradient():
    d = _inputs()
    vocab = 7
    g = torch.Generator().manual_seed(1)
    logits = torch.randn(3, 10, vocab, generator=g, requires_grad=True)
    ids = torch.randint(0, vocab, (3, 10), generator=g)
    values = torch.randn(3, 10, generator=g, requires_grad=True)
    logp, entropy = token_logprobs_and_entropy(logits, ids, temperature=0.7)
    losses = ppo_losses(
        logp,
        d["old_logp"],
        d["advantages"],
        entropy,
        d["mask"],
        clip_low=0.2,
        clip_high=0.2,
        values=values,
        old_values=d["old_values"],
        returns=d["returns"],
        value_clip=0.2,
    )
    (losses["policy_loss"] - 0.01 * losses["entropy"] + losses["value_loss"]).backward()
    # token t's log-prob is read from the logits at t - 1
    logit_mask = torch.zeros(3, 10)
    logit_mask[:, :-1] = d["mask"][:, 1:]
    assert (logits.grad[logit_mask == 0] == 0).all()
    assert (values.grad[d["mask"] == 0] == 0).all()
    assert logits.grad[logit_mask == 1].abs().sum() > 0
    assert values.grad[d["mask"] == 1].abs().sum() > 0


def test_ratio_clipping():
    mask = torch.ones(1, 2)
    old = torch.zeros(1, 2)
    adv = torch.tensor([[1.0, -1.0]])
    new = torch.log(torch.tensor([[1.5, 0.5]])).requires_grad_()
    out = ppo_losses(new, old, adv, torch.zeros(1, 2), mask, clip_low=0.2, clip_high=0.2)
    # token 0: ratio 1.5, A>0 -> clipped at 1.2; token 1: ratio 0.5, A<0 -> clipped at 0.8
    torch.testing.assert_close(out["policy_loss"], torch.tensor((-1.2 + 0.8) / 2))
    assert float(out["clip_fraction"]) == 1.0
    out["policy_loss"].backward()
    assert (new.grad == 0).all()  # both are clipped: no gradient


def test_value_clipping():
    mask = torch.ones(1, 1)
    z = torch.zeros(1, 1)
    values = torch.tensor([[1.0]], requires_grad=True)
    out = ppo_losses(z, z, z, z, mask, clip_low=0.2, clip_high=0.2, values=values, old_values=z,
                     returns=torch.tensor([[2.0]]), value_clip=0.2)  # fmt: skip
    # unclipped error (1-2)^2 = 1; clipped value 0.2 -> (0.2-2)^2 = 3.24; max -> 3.24 / 2
    torch.testing.assert_close(out["value_loss"], torch.tensor(1.62))


def test_clip_higher_lets_a_good_unlikely_token_gain_more():
    mask = torch.ones(1, 2)
    old = torch.zeros(1, 2)
    adv = torch.tensor([[1.0, -1.0]])
    new = torch.log(torch.tensor([[1.25, 0.75]]))
    sym = ppo_losses(new, old, adv, torch.zeros(1, 2), mask, clip_low=0.2, clip_high=0.2)
    high = ppo_losses(new, old, adv, torch.zeros(1, 2), mask, clip_low=0.2, clip_high=0.28)
    # symmetric: 1.25 -> 1.2 and 0.75 -> 0.8; clip-higher: 1.25 is inside [0.8, 1.28]
    torch.testing.assert_close(sym["policy_loss"], torch.tensor((-1.2 + 0.8) / 2))
    torch.testing.assert_close(high["policy_loss"], torch.tensor((-1.25 + 0.8) / 2))
    assert float(sym["clip_fraction"]) == 1.0 and float(high["clip_fraction"]) == 0.5


def test_sequence_mean_weighs_every_episode_the_same():
    x = torch.tensor([[1.0, 1.0, 1.0, 1.0], [5.0, 0.0, 0.0, 0.0]])
    mask = torch.tensor([[1, 1, 1, 1], [1, 0, 0, 0]])
    assert float(aggregate(x, mask, "token_mean")) == pytest.approx(9 / 5)
    assert float(aggregate(x, mask, "seq_mean_token_mean")) == pytest.approx((1 + 5) / 2)
    empty = torch.zeros(1, 4)  # a row without action tokens does not count
    assert float(
        aggregate(torch.cat([x, empty]), torch.cat([mask, empty]), "seq_mean_token_mean")
    ) == pytest.approx(3.0)


def test_kl_estimators_and_kl_loss_by_hand():
    logp = torch.log(torch.tensor([[0.5, 0.2]]))
    ref = torch.log(torch.tensor([[0.25, 0.4]]))
    k1 = kl_estimate(logp, ref, "k1")
    k3 = kl_estimate(logp, ref, "k3")
    torch.testing.assert_close(k1, torch.tensor([[math.log(2), math.log(0.5)]]))
    # k3 = r - log r - 1 with r = ref / pi: r = 0.5 -> 0.5 + log 2 - 1; r = 2 -> 2 - log 2 - 1
    torch.testing.assert_close(
        k3, torch.tensor([[0.5 + math.log(2) - 1, 1 - math.log(2)]]), atol=1e-6, rtol=1e-6
    )
    assert (k3 >= 0).all()
    mask = torch.tensor([[1, 0]])
    out = ppo_losses(logp, logp, torch.zeros(1, 2), torch.zeros(1, 2), mask, clip_low=0.2,
                     clip_high=0.2, ref_logp=ref, kl_estimator="k3")  # fmt: skip
    torch.testing.assert_close(out["kl_loss"], torch.tensor(0.5 + math.log(2) - 1))
