"""Plain Python loop versions of the estimators in `advantages.py`.

They follow the definitions one row and one token at a time, with no vectorisation,
and serve as the reference the vectorised versions are tested and benchmarked
against. Not used in training.
"""

from __future__ import annotations

import torch


def _gae_row(
    rewards: list[float], values: list[float], ends: list[bool], gamma: float, lam: float
) -> list[float]:
    """GAE over one sequence; after a position flagged in `ends` nothing is bootstrapped."""
    n = len(rewards)
    adv = [0.0] * n
    running = 0.0
    for i in range(n - 1, -1, -1):
        last = i == n - 1 or ends[i]
        next_value = 0.0 if last else values[i + 1]
        running = (
            rewards[i] + gamma * next_value - values[i] + (0.0 if last else gamma * lam * running)
        )
        adv[i] = running
    return adv


def masked_gae_loop(token_rewards, values, loss_mask, gamma, lam):
    adv = torch.zeros_like(values, dtype=torch.float64)
    for b in range(values.shape[0]):
        pos = [t for t in range(values.shape[1]) if loss_mask[b, t]]
        r = [float(token_rewards[b, t]) for t in pos]
        v = [float(values[b, t]) for t in pos]
        for t, a in zip(pos, _gae_row(r, v, [False] * len(pos), gamma, lam), strict=True):
            adv[b, t] = a
    ret = (adv + values.double()) * loss_mask.bool()
    return adv, ret


def _turn_returns_row(rewards, values, turn_pos, gamma_turn, lam_turn):
    r = [float(rewards[t]) for t in turn_pos]
    v = [float(values[t]) for t in turn_pos]
    adv = _gae_row(r, v, [False] * len(turn_pos), gamma_turn, lam_turn)
    return adv, [a + vv for a, vv in zip(adv, v, strict=True)]


def bi_level_gae_loop(
    token_rewards, values, loss_mask, turn_end_mask, gamma_token, lam_token, gamma_turn, lam_turn
):
    adv = torch.zeros_like(values, dtype=torch.float64)
    for b in range(values.shape[0]):
        T = values.shape[1]
        turn_pos = [t for t in range(T) if turn_end_mask[b, t]]
        _, turn_ret = _turn_returns_row(token_rewards[b], values[b], turn_pos, gamma_turn, lam_turn)
        rewards = [float(x) for x in token_rewards[b]]
        for t, g in zip(turn_pos, turn_ret, strict=True):
            rewards[t] = g
        pos = [t for t in range(T) if loss_mask[b, t]]
        r = [rewards[t] for t in pos]
        v = [float(values[b, t]) for t in pos]
        ends = [bool(turn_end_mask[b, t]) for t in pos]
        for t, a in zip(pos, _gae_row(r, v, ends, gamma_token, lam_token), strict=True):
            adv[b, t] = a
    ret = (adv + values.double()) * loss_mask.bool()
    return adv, ret


def turn_wise_gae_loop(token_rewards, values, loss_mask, turn_end_mask, gamma_turn, lam_turn):
    adv = torch.zeros_like(values, dtype=torch.float64)
    ret = torch.zeros_like(values, dtype=torch.float64)
    for b in range(values.shape[0]):
        T = values.shape[1]
        turn_pos = [t for t in range(T) if turn_end_mask[b, t]]
        t_adv, t_ret = _turn_returns_row(
            token_rewards[b], values[b], turn_pos, gamma_turn, lam_turn
        )
        j = 0
        for t in range(T):
            while j < len(turn_pos) and turn_pos[j] < t:
                j += 1
            if loss_mask[b, t] and j < len(turn_pos):
                adv[b, t], ret[b, t] = t_adv[j], t_ret[j]
    return adv, ret


def grpo_advantages_loop(episode_rewards, group_ids, loss_mask, eps=1e-6):
    rewards = [float(r) for r in episode_rewards]
    groups = [int(g) for g in group_ids]
    adv = torch.zeros(loss_mask.shape, dtype=torch.float64)
    ret = torch.zeros(loss_mask.shape, dtype=torch.float64)
    for b, (r, g) in enumerate(zip(rewards, groups, strict=True)):
        same = [rewards[i] for i in range(len(rewards)) if groups[i] == g]
        score = 0.0
        if len(same) > 1:
            mean = sum(same) / len(same)
            std = (sum((x - mean) ** 2 for x in same) / (len(same) - 1)) ** 0.5
            score = (r - mean) / (std + eps)
        for t in range(loss_mask.shape[1]):
            if loss_mask[b, t]:
                adv[b, t], ret[b, t] = score, r
    return adv, ret
