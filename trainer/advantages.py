"""Advantage estimators over multi-turn token sequences.

Every function takes tensors of shape (batch, tokens) and returns
`(advantages, returns)` of the same shape, before any whitening
(`masked_whiten` does that, over the loss mask only). Positions outside the loss
mask get advantage 0 and return 0. `ESTIMATORS` (at the end) is the one table the
trainer looks an estimator up in; a new one is a function and a row there.

Shapes and meanings:
- `token_rewards`: reward at each token. Turn rewards sit at each turn's last action
  token (the turn-end token); other action tokens carry only the KL penalty.
- `values`: the critic's value at each token: V of the prefix before the token.
- `loss_mask`: 1 on the agent's own (action) tokens, 0 on system, observation and
  image tokens. Masked tokens are skipped by every recursion: the "next value" of an
  action token is the value of the next action token, whatever lies between them.
- `turn_end_mask`: 1 on the last action token of each turn (a subset of `loss_mask`).

Implementation: the action tokens of each row are first compacted to the front
(`_compact`), so the recursions run over the action tokens only, vectorised over the
batch; `_reverse_scan` is the one backward loop, over the compacted time axis. The
plain per-row loop versions these are checked against live in
`trainer/advantages_loop.py`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

# ---------------------------------------------------------------------------- helpers


def _check(name: str, *tensors: torch.Tensor) -> None:
    shape = tensors[0].shape
    if len(shape) != 2:
        raise ValueError(f"{name}: expected tensors of shape (batch, tokens), got {tuple(shape)}")
    for t in tensors[1:]:
        if t.shape != shape:
            raise ValueError(f"{name}: shape mismatch {tuple(t.shape)} vs {tuple(shape)}")


def _compact(mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Indices that move the masked-in positions of each row to the front, in order.

    Returns `(index, valid)`: `x.gather(1, index)` is x with the positions where
    `mask` is 1 first (in their original order), and `valid` marks those columns.
    Only the first `max(mask.sum(1))` columns are kept.
    """
    mask = mask.bool()
    batch, tokens = mask.shape
    counts = mask.sum(1)
    length = int(counts.max()) if mask.numel() else 0
    # each masked-in position's slot in the compacted row; the others go to a spare column
    slot = mask.long().cumsum(1) - 1
    slot = torch.where(mask, slot, torch.full_like(slot, length))
    index = torch.zeros(batch, length + 1, dtype=torch.long)
    index.scatter_(1, slot, torch.arange(tokens).expand(batch, tokens))
    index = index[:, :length]
    valid = torch.arange(length) < counts[:, None]
    return index, valid


def _scatter_back(
    compact: torch.Tensor, index: torch.Tensor, valid: torch.Tensor, like: torch.Tensor
) -> torch.Tensor:
    """The inverse of gathering with `index`: compacted values back at their positions
    (0 elsewhere); the unused compacted columns are sent to a spare column and dropped."""
    batch, tokens = like.shape
    out = torch.zeros(batch, tokens + 1, dtype=like.dtype)
    target = torch.where(valid, index, torch.full_like(index, tokens))
    return out.scatter(1, target, compact)[:, :tokens]


def _next_along(x: torch.Tensor, valid: torch.Tensor) -> torch.Tensor:
    """x shifted one step left within each row's valid prefix; 0 after the last valid one."""
    nxt = torch.zeros_like(x)
    nxt[:, :-1] = x[:, 1:]
    nxt_valid = torch.zeros_like(valid)
    nxt_valid[:, :-1] = valid[:, 1:]
    return torch.where(nxt_valid, nxt, torch.zeros_like(nxt))


def _reverse_scan(delta: torch.Tensor, carry: torch.Tensor) -> torch.Tensor:
    """a[t] = delta[t] + carry[t] * a[t + 1], a[T] = 0; a loop over time, vectorised over rows."""
    out = torch.zeros_like(delta)
    if delta.shape[1] == 0:
        return out
    acc = torch.zeros_like(delta[:, 0])
    # the loop runs on float64 numpy views when possible: a per-step torch call costs
    # microseconds of dispatch, which dominates on 128-row columns
    d, c, o, a = delta.numpy(), carry.numpy(), out.numpy(), acc.numpy()
    for t in range(delta.shape[1] - 1, -1, -1):
        a = d[:, t] + c[:, t] * a
        o[:, t] = a
    return out


def _gae_compacted(
    rewards: torch.Tensor,
    values: torch.Tensor,
    valid: torch.Tensor,
    gamma: float,
    lam: float,
    segment_end: torch.Tensor | None = None,
) -> torch.Tensor:
    """GAE over compacted rows; the bootstrap after a `segment_end` position is 0."""
    next_values = _next_along(values, valid)
    cont = valid.to(values.dtype)
    if segment_end is not None:
        next_values = torch.where(segment_end, torch.zeros_like(next_values), next_values)
    delta = (rewards + gamma * next_values - values) * cont
    carry = gamma * lam * _next_along(cont, valid)
    if segment_end is not None:
        carry = torch.where(segment_end, torch.zeros_like(carry), carry)
    return _reverse_scan(delta, carry)


def _prepare(*tensors: torch.Tensor) -> list[torch.Tensor]:
    return [t.detach().to("cpu", torch.float64) for t in tensors]


# ---------------------------------------------------------------------------- estimators


@torch.no_grad()
def masked_gae(
    token_rewards: torch.Tensor,
    values: torch.Tensor,
    loss_mask: torch.Tensor,
    gamma: float,
    lam: float,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Token-level GAE over the loss-masked tokens only (VAGEN-Base).

    delta_i = r_i + gamma * V_next(i) - V_i, A_i = delta_i + gamma * lam * A_next(i),
    where next(i) is the next loss-masked token and V after the last one is 0.
    """
    _check("masked_gae", token_rewards, values, loss_mask)
    device, dtype = values.device, values.dtype
    r, v = _prepare(token_rewards, values)
    index, valid = _compact(loss_mask)
    adv_c = _gae_compacted(r.gather(1, index), v.gather(1, index), valid, gamma, lam)
    adv = _scatter_back(adv_c, index, valid, r)
    ret = (adv + v) * loss_mask.to("cpu").bool()
    return adv.to(device, dtype), ret.to(device, dtype)


@torch.no_grad()
def turn_level_gae(
    token_rewards: torch.Tensor,
    values: torch.Tensor,
    turn_end_mask: torch.Tensor,
    gamma_turn: float,
    lam_turn: float,
) -> tuple[torch.Tensor, torch.Tensor]:
    """GAE across turns, read and written at the turn-end tokens only.

    Returns (turn advantages, turn returns) as (batch, tokens) tensors that are
    nonzero only at turn-end tokens.
    """
    _check("turn_level_gae", token_rewards, values, turn_end_mask)
    r, v = _prepare(token_rewards, values)
    index, valid = _compact(turn_end_mask)
    adv_c = _gae_compacted(r.gather(1, index), v.gather(1, index), valid, gamma_turn, lam_turn)
    adv = _scatter_back(adv_c, index, valid, r)
    ret = (adv + v) * turn_end_mask.to("cpu").bool()
    return adv, ret


@torch.no_grad()
def bi_level_gae(
    token_rewards: torch.Tensor,
    values: torch.Tensor,
    loss_mask: torch.Tensor,
    turn_end_mask: torch.Tensor,
    gamma_token: float,
    lam_token: float,
    gamma_turn: float,
    lam_turn: float,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Bi-Level GAE (VAGEN): turn-level GAE first, then token-level GAE inside each turn.

    1. Across turns: delta_j = R_j + gamma_turn * V(end_{j+1}) - V(end_j), with R_j the
       reward at turn j's end token and V after the last turn 0;
       A_j = delta_j + gamma_turn * lam_turn * A_{j+1}.
    2. Inside turn j: the turn-end token's reward becomes the turn return A_j + V(end_j)
       and nothing is bootstrapped beyond it, so its advantage is exactly A_j; every
       other action token keeps its own reward (the KL penalty) and gets token-level
       GAE with gamma_token, lam_token over the action tokens of its turn.
    Action tokens after the last turn end (a turn cut off before its end) form a
    segment of their own with bootstrap 0.
    """
    _check("bi_level_gae", token_rewards, values, loss_mask, turn_end_mask)
    if bool((turn_end_mask.bool() & ~loss_mask.bool()).any()):
        raise ValueError("bi_level_gae: every turn-end token must be inside the loss mask")
    device, dtype = values.device, values.dtype
    r, v = _prepare(token_rewards, values)
    turn_end = turn_end_mask.to("cpu").bool()

    _, turn_returns = turn_level_gae(r, v, turn_end, gamma_turn, lam_turn)
    r = torch.where(turn_end, turn_returns, r)

    index, valid = _compact(loss_mask)
    seg_end = turn_end.gather(1, index) & valid
    adv_c = _gae_compacted(
        r.gather(1, index), v.gather(1, index), valid, gamma_token, lam_token, segment_end=seg_end
    )
    adv = _scatter_back(adv_c, index, valid, r)
    ret = (adv + v) * loss_mask.to("cpu").bool()
    return adv.to(device, dtype), ret.to(device, dtype)


@torch.no_grad()
def turn_wise_gae(
    token_rewards: torch.Tensor,
    values: torch.Tensor,
    loss_mask: torch.Tensor,
    turn_end_mask: torch.Tensor,
    gamma_turn: float,
    lam_turn: float,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Turn-level GAE whose advantage is given to every action token of the turn.

    The returns (value targets) are the turn return, also spread over the turn's
    action tokens. Action tokens after the last turn end get 0.
    """
    _check("turn_wise_gae", token_rewards, values, loss_mask, turn_end_mask)
    device, dtype = values.device, values.dtype
    turn_end = turn_end_mask.to("cpu").bool()
    mask = loss_mask.to("cpu").bool()
    t_adv, t_ret = turn_level_gae(token_rewards, values, turn_end, gamma_turn, lam_turn)
    # each action token reads the value at the first turn end at or after it:
    # a reverse cumulative "last seen" fill, done with a flip and cummax over indices
    T = turn_end.shape[1]
    pos = torch.arange(T).expand_as(turn_end)
    end_pos = torch.where(turn_end, pos, torch.full_like(pos, T))
    next_end = end_pos.flip(1).cummin(1).values.flip(1)  # first turn end at or after t
    has_end = next_end < T
    safe = next_end.clamp(max=T - 1)
    keep = mask & has_end
    adv = torch.where(keep, t_adv.gather(1, safe), torch.zeros_like(t_adv))
    ret = torch.where(keep, t_ret.gather(1, safe), torch.zeros_like(t_ret))
    return adv.to(device, dtype), ret.to(device, dtype)


@torch.no_grad()
def grpo_advantages(
    episode_rewards: torch.Tensor,
    group_ids: torch.Tensor,
    loss_mask: torch.Tensor,
    eps: float = 1e-6,
) -> tuple[torch.Tensor, torch.Tensor]:
    """GRPO: each episode's reward normalised within its group (same level, several tries).

    A = (R - mean_group(R)) / (std_group(R) + eps), spread over the episode's action
    tokens. A group of one gets advantage 0. There is no critic: the returns are the
    episode rewards spread the same way (for logging).
    """
    if episode_rewards.dim() != 1 or group_ids.shape != episode_rewards.shape:
        raise ValueError(
            "grpo_advantages: episode_rewards and group_ids must be 1-D and equal in length"
        )
    if loss_mask.shape[0] != episode_rewards.shape[0]:
        raise ValueError("grpo_advantages: loss_mask has a different batch size")
    rewards = episode_rewards.detach().to("cpu", torch.float64)
    _, inverse, counts = torch.unique(group_ids.cpu(), return_inverse=True, return_counts=True)
    n_groups = counts.numel()
    sums = torch.zeros(n_groups, dtype=torch.float64).index_add(0, inverse, rewards)
    means = sums / counts
    sq = torch.zeros(n_groups, dtype=torch.float64).index_add(
        0, inverse, (rewards - means[inverse]) ** 2
    )
    # unbiased std like torch.std; groups of one have no spread to normalise by
    std = torch.sqrt(sq / (counts - 1).clamp(min=1))
    score = (rewards - means[inverse]) / (std[inverse] + eps)
    score = torch.where(counts[inverse] > 1, score, torch.zeros_like(score))
    mask = loss_mask.to("cpu", torch.float64)
    adv = score[:, None] * mask
    ret = rewards[:, None] * mask
    dtype = episode_rewards.dtype if episode_rewards.is_floating_point() else torch.float32
    return adv.to(loss_mask.device, dtype), ret.to(loss_mask.device, dtype)


def masked_mean(x: torch.Tensor, mask: torch.Tensor, dim: int | None = None) -> torch.Tensor:
    mask = mask.to(x.dtype)
    if dim is None:
        return (x * mask).sum() / mask.sum().clamp(min=1)
    return (x * mask).sum(dim) / mask.sum(dim).clamp(min=1)


def masked_whiten(
    x: torch.Tensor, mask: torch.Tensor, shift_mean: bool = True, eps: float = 1e-8
) -> torch.Tensor:
    """Normalise x to zero mean, unit variance over the masked-in positions; 0 elsewhere."""
    mean = masked_mean(x, mask)
    var = masked_mean((x - mean) ** 2, mask)
    out = (x - mean) * torch.rsqrt(var + eps)
    if not shift_mean:
        out = out + mean
    return out * mask.to(x.dtype)


# ---------------------------------------------------------------------------- the table


@dataclass
class AdvantageInputs:
    """Everything an estimator may read, for a whole iteration's episodes (rows)."""

    token_rewards: torch.Tensor  # (episodes, tokens), KL penalty included when in reward
    values: torch.Tensor | None  # (episodes, tokens); None when no critic is run
    loss_mask: torch.Tensor
    turn_end: torch.Tensor
    episode_rewards: torch.Tensor  # (episodes,) summed turn rewards
    group_ids: torch.Tensor  # (episodes,) the level seed: episodes of one level form a group


@dataclass(frozen=True)
class Estimator:
    """One advantage estimator as the trainer runs it.

    `fn(ppo, x)` gets the `ppo` config section and the iteration's inputs and returns
    `(advantages, returns)`; `critic`: whether it reads values (a critic is built,
    run and trained only then); `placement`: where the turn rewards are put, "turn"
    (each at its turn's last action token) or "episode" (their sum at the last one)."""

    fn: Callable[[Any, AdvantageInputs], tuple[torch.Tensor, torch.Tensor]]
    critic: bool = True
    placement: str = "turn"


def _values(x: AdvantageInputs) -> torch.Tensor:
    if x.values is None:
        raise ValueError("this estimator needs the critic's values")
    return x.values


ESTIMATORS: dict[str, Estimator] = {
    # VAGEN: turn-level GAE across turns, then token-level GAE inside each turn
    "bi_level": Estimator(
        lambda p, x: bi_level_gae(
            x.token_rewards,
            _values(x),
            x.loss_mask,
            x.turn_end,
            p.gamma_token,
            p.lam_token,
            p.gamma_turn,
            p.lam_turn,
        )  # fmt: skip
    ),
    # VAGEN-Base: token-level GAE with the episode's reward at its last action token
    "gae": Estimator(
        lambda p, x: masked_gae(
            x.token_rewards, _values(x), x.loss_mask, p.gamma_token, p.lam_token
        ),
        placement="episode",
    ),
    # one turn-level advantage for every token of the turn
    "turn_wise": Estimator(
        lambda p, x: turn_wise_gae(
            x.token_rewards, _values(x), x.loss_mask, x.turn_end, p.gamma_turn, p.lam_turn
        )
    ),
    # no critic: each episode's reward against the others of its level
    "grpo": Estimator(
        lambda p, x: grpo_advantages(x.episode_rewards, x.group_ids, x.loss_mask), critic=False
    ),
}
