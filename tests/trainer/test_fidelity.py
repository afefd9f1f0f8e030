"""What the review of the trainer against VAGEN/verl asked for (issue 13): values read
the prefix before their token, GRPO with KL and no critic, the StarPO-S filter, config
refusals, held-out eval seeds, and retries only for transient failures."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch
from torch import nn

from clients import EnvClient
from clients.errors import InvalidArgument
from clients.eval import EVAL_SEED_BASE, eval_level_seeds, train_level_seed
from trainer.advantages import ESTIMATORS, masked_gae
from trainer.config import ConfigError, load_config
from trainer.groups import filter_groups
from trainer.model import Critic, load_policy
from trainer.ppo import Minibatch, build_models, compute_advantages, level_seeds, ppo_losses
from trainer.rollout import EpisodeFailed, collect
from trainer.trajectory import Batch, EpisodeTokens, policy_forward

BASE = ["env.servers=['127.0.0.1:1']", "model.path=m"]


# ----------------------------------------------------------------------------- values


def _ids_batch(ids: torch.Tensor) -> Batch:
    ones = torch.ones_like(ids)
    return Batch(ids, ones, ones, torch.zeros_like(ids), ones.float() * 0, None, None, -1)


@pytest.mark.parametrize("kind", ["head", "separate"])
def test_changing_token_t_leaves_value_t_and_changes_value_t_plus_1(tiny_model_path, kind):
    model, _ = load_policy(tiny_model_path)
    torch.manual_seed(0)
    if kind == "head":
        critic = Critic(model.config.text_config.hidden_size)
    else:
        critic = Critic(model.config.text_config.hidden_size, backbone=model.model)
    nn.init.normal_(critic.head.weight)  # the zero init would make every value 0

    def values(ids: torch.Tensor) -> torch.Tensor:
        batch = _ids_batch(ids)
        with torch.no_grad():
            if kind == "head":
                hidden = policy_forward(model, batch, 1.0, want_hidden=True).hidden
                return critic(hidden=hidden)
            return critic(inputs=batch.model_inputs())

    ids = torch.tensor([[1, 40, 41, 42, 43, 44, 45]])
    t = 4
    other = ids.clone()
    other[0, t] = 77
    a, b = values(ids), values(other)
    torch.testing.assert_close(a[0, : t + 1], b[0, : t + 1])  # V before token t: unchanged
    assert not torch.allclose(a[0, t + 1], b[0, t + 1])  # the prefix after it has changed
    assert a[0, 0] == 0  # nothing before position 0


class _Lookup(nn.Module):
    """A backbone whose hidden state at a token is a fixed number per token id: with a
    unit head, a value model that knows each state's true value."""

    def __init__(self, table: dict[int, float]) -> None:
        super().__init__()
        self.table = table

    def forward(self, input_ids, **_):
        h = torch.tensor([[[self.table[int(i)]] for i in row] for row in input_ids])
        return SimpleNamespace(last_hidden_state=h)


def test_a_perfect_critic_gives_a_one_token_choice_opposite_advantages():
    # prompt token 0, then one action: token 1 (reward 1) or token 2 (reward 0), each
    # with probability 1/2. True values: after the prompt 0.5; after the action, its reward
    prompt, good, bad = 0, 1, 2
    critic = Critic(1, backbone=_Lookup({prompt: 0.5, good: 1.0, bad: 0.0}))
    with torch.no_grad():
        critic.head.weight.fill_(1.0)
    ids = torch.tensor([[prompt, good], [prompt, bad]])
    values = critic(inputs={"input_ids": ids}).detach()
    mask = torch.tensor([[0, 1], [0, 1]])
    rewards = torch.tensor([[0.0, 1.0], [0.0, 0.0]])
    adv, _ = masked_gae(rewards, values, mask, gamma=1.0, lam=1.0)
    # the baseline of the action is V(prompt) = 0.5; read at the action itself it
    # would be the reward, and both advantages 0
    torch.testing.assert_close(adv[:, 1], torch.tensor([0.5, -0.5]))


# ----------------------------------------------------------------------------- GRPO


def test_config_refuses_grpo_with_one_episode_per_level():
    with pytest.raises(ConfigError, match="group_size"):
        load_config(None, [*BASE, "ppo.estimator=grpo"])
    with pytest.raises(ConfigError, match="group_size"):
        load_config(None, [*BASE, "ppo.filter_ratio=0.5"])
    with pytest.raises(ConfigError, match="kl_mode"):
        load_config(None, [*BASE, "ppo.estimator=grpo", "ppo.group_size=4", "ppo.kl_mode=reward"])
    cfg = load_config(None, [*BASE, "ppo.estimator=grpo", "ppo.group_size=4"])
    assert cfg.ppo.kl_in == "loss" and cfg.ppo.kl_coef > 0  # the KL is carried, as a loss
    assert load_config(None, BASE).ppo.kl_in == "reward"


def test_grpo_with_kl_by_hand():
    cfg = load_config(None, [*BASE, "ppo.estimator=grpo", "ppo.group_size=2",
                             "ppo.kl_estimator=k3", "ppo.kl_coef=0.1"])  # fmt: skip
    # two levels, two episodes each; rewards [3, 1] and [2, 2]; two action tokens each
    mask = torch.tensor([[0, 1, 1], [0, 1, 1], [0, 1, 1], [0, 1, 1]])
    mbs = []
    for rows, rewards, seeds in (([0, 1], [3.0, 1.0], [7, 7]), ([2, 3], [2.0, 2.0], [8, 8])):
        m = mask[rows]
        batch = Batch(m, m, m, m * 0, m.float() * 0, None, None, -1)
        mbs.append(Minibatch(batch, torch.zeros(2, 3), None, torch.zeros(2, 3), None,
                             m.float() * 0, torch.tensor(rewards), torch.tensor(seeds)))  # fmt: skip
    compute_advantages(cfg, mbs)
    # group 7: mean 2, std (unbiased) sqrt(2): A = +-1/sqrt(2); group 8: no spread, A = 0
    s = 2**-0.5
    torch.testing.assert_close(mbs[0].advantages, torch.tensor([[0, s, s], [0, -s, -s]]),
                               atol=1e-5, rtol=1e-5)  # fmt: skip
    assert (mbs[1].advantages == 0).all()
    # the update's loss: ratio 1, so the policy term is -mean(A); plus kl_coef * k3
    logp = torch.log(torch.full((2, 3), 0.5))
    ref = torch.log(torch.full((2, 3), 0.25))  # r = 0.5: k3 = 0.5 + log 2 - 1
    out = ppo_losses(logp, logp, mbs[0].advantages, torch.zeros(2, 3), mbs[0].mask,
                     clip_low=0.2, clip_high=0.2, ref_logp=ref, kl_estimator="k3")  # fmt: skip
    loss = out["policy_loss"] + cfg.ppo.kl_coef * out["kl_loss"]
    k3 = 0.5 + torch.log(torch.tensor(2.0)) - 1
    torch.testing.assert_close(loss, 0.0 + 0.1 * k3, atol=1e-6, rtol=1e-6)
    assert "value_loss" not in out


def test_no_critic_is_built_under_grpo(tiny_model_path):
    over = [*BASE[:1], f"model.path='{tiny_model_path}'", "ppo.group_size=2"]
    grpo = build_models(load_config(None, [*over, "ppo.estimator=grpo"]), torch.device("cpu"), 0)
    assert grpo.critic is None and set(grpo.trained()) == {"actor"}
    assert not ESTIMATORS["grpo"].critic
    ppo = build_models(load_config(None, [*over, "model.critic=head"]), torch.device("cpu"), 0)
    assert ppo.critic is not None and set(ppo.trained()) == {"actor", "critic"}


# ----------------------------------------------------------------------------- StarPO-S


def _episodes(rewards_by_level: dict[int, list[float]]) -> list[EpisodeTokens]:
    out = []
    for seed, rewards in rewards_by_level.items():
        for r in rewards:
            out.append(EpisodeTokens(info={"seed": seed, "reward": r}))
    return out


def test_filter_keeps_the_groups_whose_rewards_vary_most():
    eps = _episodes({1: [0, 0, 0, 0], 2: [0, 10, 0, 10], 3: [0, 0, 0, 10], 4: [5, 5, 5, 5]})
    kept, m = filter_groups(eps, 0.5, "std")
    assert [e.info["seed"] for e in kept] == [2] * 4 + [3] * 4
    assert m["groups"] == 4 and m["groups_kept"] == 2
    assert m["group_reward_std"] == pytest.approx([0.0, 5.0, 75**0.5 / 2, 0.0])
    # max - mean ranks the lone success first: 10 - 2.5 = 7.5 beats 10 - 5 = 5
    kept, _ = filter_groups(eps, 0.25, "max_mean")
    assert {e.info["seed"] for e in kept} == {3}
    assert len(filter_groups(eps, 1.0)[0]) == len(eps)
    assert filter_groups(eps, 0.01)[1]["groups_kept"] == 1  # never nothing


# ----------------------------------------------------------------------------- seeds


def test_eval_and_training_seeds_do_not_overlap_by_default():
    cfg = load_config(None, [*BASE, "ppo.episodes_per_iteration=16"])
    assert cfg.run.seed == 0
    trained = {s for it in range(200) for s in level_seeds(cfg, it, 0, 1)}
    evaluated = set(eval_level_seeds(0, 1000))
    assert trained and not trained & evaluated
    # at the edges of both ranges too
    assert train_level_seed(999, 999_999) < EVAL_SEED_BASE == eval_level_seeds(0, 1)[0]
    with pytest.raises(ConfigError, match="run.seed"):
        load_config(None, [*BASE, "run.seed=1000"])
    with pytest.raises(ValueError):
        eval_level_seeds(1000, 1)


# ----------------------------------------------------------------------------- retries


def test_a_deterministic_failure_is_surfaced_not_retried(visenv_server):
    calls = []

    def make_policy():
        calls.append(1)
        return SimpleNamespace(episodes={})

    with EnvClient(visenv_server.grpc) as client, pytest.raises(EpisodeFailed) as err:
        collect(client, make_policy, "tiny", [0, 1], max_attempts=3, retry_wait=0.0,
                config={"no_such_option": 1}, progress=False)  # fmt: skip
    assert isinstance(err.value.error, InvalidArgument)
    assert "no_such_option" in str(err.value)
    assert len(calls) == 1  # never run again
