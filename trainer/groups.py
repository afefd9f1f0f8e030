"""Groups of episodes that played the same level, between collection and the update.

StarPO-S (RAGEN) keeps only the groups whose rewards vary most: a group where every
try got the same reward teaches nothing (GRPO gives it advantage 0; PPO mostly
reinforces what the policy already does), and training on them is where the "echo
trap" (reward variance collapsing, then gradient spikes) starts. The spread of every
group is logged whether or not it filters.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from .trajectory import EpisodeTokens


def group_by_level(episodes: list[EpisodeTokens]) -> list[list[EpisodeTokens]]:
    """Episodes grouped by level seed, groups in order of first appearance."""
    groups: dict[int, list[EpisodeTokens]] = {}
    for ep in episodes:
        groups.setdefault(int(ep.info["seed"]), []).append(ep)
    return list(groups.values())


def group_score(rewards: list[float], by: str) -> float:
    """How much a group's episode rewards vary: "std" (population) or "max_mean"."""
    r = np.asarray(rewards, dtype=np.float64)
    if by == "std":
        return float(r.std())
    if by == "max_mean":
        return float(r.max() - r.mean())
    raise ValueError(f"unknown group filter score {by!r}; use std or max_mean")


def filter_groups(
    episodes: list[EpisodeTokens], ratio: float, by: str = "std"
) -> tuple[list[EpisodeTokens], dict[str, Any]]:
    """Keep the `ratio` fraction of level groups (at least one) with the highest score
    (ties: the earlier group); returns the kept episodes, in their order, and metrics."""
    groups = group_by_level(episodes)
    rewards = [[e.info["reward"] for e in g] for g in groups]
    stds = [group_score(r, "std") for r in rewards]
    scores = [group_score(r, by) for r in rewards]
    n_keep = max(1, round(ratio * len(groups))) if groups else 0
    ranked = sorted(range(len(groups)), key=lambda i: -scores[i])  # stable: ties keep order
    keep = set(ranked[:n_keep])
    kept_seeds = {int(groups[i][0].info["seed"]) for i in keep}
    metrics = {
        "groups": len(groups),
        "groups_kept": len(keep),
        "group_reward_std": stds,  # every group's, before the filter
        "group_reward_std_mean": float(np.mean(stds)) if stds else 0.0,
        "group_reward_std_kept": float(np.mean([stds[i] for i in keep])) if keep else 0.0,
    }
    return [e for e in episodes if int(e.info["seed"]) in kept_seeds], metrics
