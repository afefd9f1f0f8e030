"""PPO with a critic and Bi-Level GAE over remote multi-turn environments.

Read top to bottom, like CleanRL's ppo.py: the losses, the models, then `train`, whose
every iteration runs in this order:

    a. collect: roll out episodes on the env servers (clients/), sampling with the policy
    b. groups: StarPO-S keeps the level groups whose rewards vary most (optional)
    c. build the batch: minibatches of whole episodes, with one no-grad pass for the old
       log-probs, the reference log-probs and the values; token rewards = turn rewards
       at turn ends (- kl_coef * KL when the KL goes in the reward)
    d. advantages and returns over the whole iteration, by the estimator's entry in
       `advantages.ESTIMATORS` (Bi-Level GAE by default), whitened over action tokens
    e. PPO epochs over the minibatches: clipped ratio (asymmetric if asked), clipped
       value loss, entropy bonus, KL loss (if asked), gradient clipping, separate
       optimisers for actor and critic
    f. metrics (TensorBoard, metrics.jsonl, a plot) and a checkpoint

Several processes (torchrun, DDP or FSDP2) and checkpoints are in `distributed.py`.
"""

from __future__ import annotations

import copy
import json
import logging
import math
import os
import random
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.distributed as dist
from torch import nn

from clients import EnvClient
from clients.episodes import episode_json, write_episodes
from clients.eval import train_level_seed

from .advantages import ESTIMATORS, AdvantageInputs, masked_mean, masked_whiten
from .axpo import axpo_round
from .config import TrainConfig
from .distributed import (
    as_float,
    gather_weights,
    latest_checkpoint,
    load_checkpoint,
    mean_over_processes,
    min_over_processes,
    release_weights,
    save_checkpoint,
    setup_distributed,
    unwrap,
    wrap_for_processes,
)
from .groups import filter_groups
from .levels import selected_seeds
from .model import Critic, build_tiny_qwen, hidden_size_of, load_policy
from .rollout import collect, policy_factory
from .skeleton import Skeleton
from .trajectory import Batch, ChatLayout, EpisodeTokens, collate, policy_forward

__all__ = ["TrainResult", "latest_checkpoint", "ppo_losses", "train"]

log = logging.getLogger("trainer")

# ----------------------------------------------------------------------------- losses


def kl_estimate(logp: torch.Tensor, ref_logp: torch.Tensor, estimator: str) -> torch.Tensor:
    """Per-token estimate of KL(pi || pi_ref) from the sampled tokens' log-probs.

    k1 = log pi - log pi_ref (unbiased, can be negative); k3 = r - log r - 1 with
    r = pi_ref / pi (unbiased, never negative, lower variance: verl's "low_var_kl",
    clamped to [-10, 10] as there)."""
    diff = logp - ref_logp
    if estimator == "k1":
        return diff
    if estimator == "k3":
        return (torch.exp(-diff) + diff - 1).clamp(-10, 10)
    raise ValueError(f"unknown KL estimator {estimator!r}; use k1 or k3")


def aggregate(x: torch.Tensor, mask: torch.Tensor, how: str) -> torch.Tensor:
    """A per-token loss to one number: "token_mean" over every masked-in token, or
    "seq_mean_token_mean", each sequence's token mean, then the mean over sequences."""
    if how == "token_mean":
        return masked_mean(x, mask)
    if how == "seq_mean_token_mean":
        has_tokens = mask.sum(1) > 0
        return masked_mean(x, mask, dim=1)[has_tokens].mean()
    raise ValueError(f"unknown loss aggregation {how!r}")


def ppo_losses(
    new_logp: torch.Tensor,
    old_logp: torch.Tensor,
    advantages: torch.Tensor,
    entropy: torch.Tensor,
    mask: torch.Tensor,
    *,
    clip_low: float,
    clip_high: float,
    agg: str = "token_mean",
    values: torch.Tensor | None = None,
    old_values: torch.Tensor | None = None,
    returns: torch.Tensor | None = None,
    value_clip: float = 0.5,
    ref_logp: torch.Tensor | None = None,
    kl_estimator: str = "k1",
    kl_logp: torch.Tensor | None = None,
) -> dict[str, torch.Tensor]:
    """The PPO losses over the action tokens in `mask`, aggregated by `agg`.

    The ratio is clipped to [1 - clip_low, 1 + clip_high]. With `values` (and
    `old_values`, `returns`): the clipped value loss. With `ref_logp`: `kl_loss`, the KL
    to the reference policy as a loss term (its coefficient is the caller's), of
    `kl_logp` when given (ppo.kl_unmasked: the log-probs without the skeleton's mask), else
    of `new_logp`."""
    log_ratio = torch.where(mask.bool(), new_logp - old_logp, torch.zeros_like(new_logp))
    ratio = log_ratio.exp()
    pg1 = -advantages * ratio
    pg2 = -advantages * ratio.clamp(1 - clip_low, 1 + clip_high)
    clipped = (ratio < 1 - clip_low) | (ratio > 1 + clip_high)
    out = {
        "policy_loss": aggregate(torch.max(pg1, pg2), mask, agg),
        "entropy": aggregate(entropy, mask, agg),
        "clip_fraction": masked_mean(clipped.float(), mask).detach(),
        "approx_kl": masked_mean((ratio - 1) - log_ratio, mask).detach(),
    }
    if values is not None:
        assert old_values is not None and returns is not None
        v_clipped = old_values + (values - old_values).clamp(-value_clip, value_clip)
        v1 = (values - returns) ** 2
        v2 = (v_clipped - returns) ** 2
        out["value_loss"] = 0.5 * aggregate(torch.max(v1, v2), mask, agg)
    if ref_logp is not None:
        own = new_logp if kl_logp is None else kl_logp
        out["kl_loss"] = aggregate(kl_estimate(own, ref_logp, kl_estimator), mask, agg)
    return out


# ----------------------------------------------------------------------------- models


@dataclass
class Models:
    actor: nn.Module
    reference: nn.Module | None  # None: no KL, or the actor with its LoRA adapters off
    critic: Critic | None  # None when the estimator needs no critic (GRPO)
    layout: ChatLayout
    image_token_id: int
    skeleton: Skeleton | None = None  # generation.skeleton: the mask responses are sampled under

    def trained(self) -> dict[str, nn.Module]:
        """The models the optimisers step (and checkpoints hold), by name."""
        return {"actor": self.actor} | ({"critic": self.critic} if self.critic else {})


def build_models(cfg: TrainConfig, device: torch.device, rank: int) -> Models:
    path = Path(cfg.model.path)
    if cfg.model.build_tiny and not (path / "config.json").exists():
        if rank == 0:
            build_tiny_qwen(path, seed=cfg.run.seed)
        if dist.is_initialized():
            dist.barrier()
    dtype = getattr(torch, cfg.model.dtype)
    actor, processing = load_policy(cfg.model.path, dtype=dtype, device=device)
    layout = ChatLayout(processing, system_prompt=cfg.env.system_prompt)
    reference = None
    if cfg.model.lora is not None:
        from peft import LoraConfig, get_peft_model

        lora = cfg.model.lora
        actor = get_peft_model(
            actor,
            LoraConfig(
                r=lora.r,
                lora_alpha=lora.alpha,
                lora_dropout=lora.dropout,
                target_modules=lora.target_modules,
            ),
        )
    elif cfg.ppo.kl_coef > 0:
        reference = copy.deepcopy(actor).eval().requires_grad_(False)
    critic = None
    if ESTIMATORS[cfg.ppo.estimator].critic:
        if cfg.model.critic == "head":
            critic = Critic(hidden_size_of(unwrap(actor)))
        else:
            backbone, _ = load_policy(
                cfg.model.critic_path or cfg.model.path, dtype=dtype, device=device
            )
            critic = Critic(hidden_size_of(backbone), backbone=backbone.model)
        critic.to(device)
    image_token_id = processing.tokenizer.convert_tokens_to_ids(processing.image_token)
    skeleton = None
    if cfg.generation.skeleton:
        skeleton = Skeleton.for_model(unwrap(actor), processing.tokenizer, cfg.env.format,
                                      layout.im_end_id,
                                      cfg.env.reasoning.get("answer_tag", "answer"))  # fmt: skip
        skeleton.check_budget(cfg.generation.max_new_tokens)
    return Models(actor, reference, critic, layout, image_token_id, skeleton)


def forward(
    models: Models, batch: Batch, temperature: float, free: bool = False
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None, torch.Tensor | None]:
    """(log-probs, entropies, values or None, log-probs without the skeleton's mask or
    None) under the current actor and critic; values[t] = V(tokens before t), see `Critic`;
    the last only with `free` (ppo.kl_unmasked)."""
    critic = unwrap(models.critic) if models.critic is not None else None
    shared = critic is not None and critic.backbone is None
    logp, entropy, hidden, free_logp = policy_forward(
        models.actor, batch, temperature, want_hidden=shared,
        suppressed=models.layout.suppressed, skeleton=models.skeleton, free=free,
    )  # fmt: skip
    values = None
    if shared:
        values = models.critic(hidden=hidden.detach())  # a head on the policy's features
    elif models.critic is not None:
        values = models.critic(inputs=batch.model_inputs())
    return logp, entropy, values, free_logp


@torch.no_grad()
def reference_logprobs(
    models: Models, batch: Batch, temperature: float, unmasked: bool = False
) -> torch.Tensor:
    """The reference policy's log-probs of the batch's tokens: under the skeleton's mask as
    sampled, or without it (`unmasked`, ppo.kl_unmasked)."""
    model = models.reference if models.reference is not None else models.actor
    skeleton = None if unmasked else models.skeleton
    rule = {"suppressed": models.layout.suppressed, "skeleton": skeleton}
    if models.reference is not None:
        return policy_forward(model, batch, temperature, **rule).logp
    with unwrap(models.actor).disable_adapter():
        return policy_forward(model, batch, temperature, **rule).logp


# ----------------------------------------------------------------------------- levels


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)  # CPU and every GPU


def make_reproducible(cfg: TrainConfig) -> None:
    """Same config and seed on the same machine: the same numbers. Every random draw
    (sampling, minibatch order, initial weights) comes from generators seeded by
    `seed_everything`; this fixes what else changes floating-point results: the thread
    count (CPU reductions are split by thread) and non-deterministic kernels. Process
    wide, as torch's settings are."""
    if cfg.run.threads is not None:
        torch.set_num_threads(cfg.run.threads)
    if cfg.run.deterministic:
        os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")  # cuBLAS's condition
        torch.use_deterministic_algorithms(True, warn_only=True)


def level_seeds(cfg: TrainConfig, iteration: int, rank: int, world: int) -> list[int]:
    """This process's episode seeds for one iteration: distinct levels, each repeated
    `group_size` times; a pure function of (seed, iteration, rank), so a resumed run
    plays exactly the levels it would have played. With `level_pool` the levels cycle
    over that many seeds (training on a fixed set of levels). The seeds are the
    training range of `run.seed` (`clients.eval.train_level_seed`), which `visenv eval`
    never plays by default."""
    per_rank = cfg.ppo.episodes_per_iteration // world
    levels = per_rank // cfg.ppo.group_size
    first = (iteration * world + rank) * levels
    pool = cfg.ppo.level_pool
    index = [(first + i) % pool if pool else first + i for i in range(levels)]
    if cfg.ppo.level_file:  # levels chosen by measured difficulty (ThinkLite-VL)
        p = cfg.ppo
        chosen = selected_seeds(
            p.level_file, p.level_success_min, p.level_success_max, cfg.env.name
        )
        return [chosen[i % len(chosen)] for i in index for _ in range(p.group_size)]
    return [train_level_seed(cfg.run.seed, i) for i in index for _ in range(cfg.ppo.group_size)]


# ----------------------------------------------------------------------------- one iteration


@dataclass
class Minibatch:
    """Whole episodes padded into one batch, with everything PPO needs from them that
    stays fixed during the epochs."""

    batch: Batch
    old_logp: torch.Tensor
    ref_logp: torch.Tensor | None  # None when the KL is off
    old_kl_logp: torch.Tensor  # what the KL is of: old_logp, or unmasked (ppo.kl_unmasked)
    old_values: torch.Tensor | None  # None without a critic
    token_rewards: torch.Tensor  # turn rewards, minus kl_coef * KL when in the reward
    episode_rewards: torch.Tensor  # (episodes,)
    seeds: torch.Tensor  # (episodes,) the level of each episode
    advantages: torch.Tensor | None = None  # set by compute_advantages
    returns: torch.Tensor | None = None

    @property
    def mask(self) -> torch.Tensor:
        return self.batch.loss_mask


@torch.no_grad()
def make_minibatch(
    cfg: TrainConfig, models: Models, episodes: list[EpisodeTokens], device: torch.device
) -> Minibatch:
    p, temperature = cfg.ppo, cfg.generation.temperature
    placement = ESTIMATORS[p.estimator].placement
    batch = collate(episodes, models.layout.pad_id, models.image_token_id, placement).to(device)
    old_logp, _, old_values, old_free = forward(models, batch, temperature, p.kl_unmasked)
    ref_logp = None
    if p.kl_coef > 0:
        ref_logp = reference_logprobs(models, batch, temperature, unmasked=p.kl_unmasked)
    old_kl_logp = old_free if old_free is not None else old_logp
    token_rewards = batch.token_rewards
    if ref_logp is not None and p.kl_in == "reward":
        kl = kl_estimate(old_kl_logp, ref_logp, p.kl_estimator) * batch.loss_mask
        token_rewards = token_rewards - p.kl_coef * kl
    return Minibatch(
        batch=batch,
        old_logp=old_logp,
        ref_logp=ref_logp,
        old_kl_logp=old_kl_logp,
        old_values=None if old_values is None else (old_values * batch.loss_mask).float(),
        token_rewards=token_rewards,
        episode_rewards=torch.tensor([e.info["reward"] for e in episodes], dtype=torch.float32),
        seeds=torch.tensor([e.info["seed"] for e in episodes]),
    )


def _stack(rows: list[torch.Tensor]) -> torch.Tensor:
    """(b_i, t_i) tensors padded with zeros to the longest t and stacked."""
    length = max(r.shape[1] for r in rows)
    return torch.cat([nn.functional.pad(r, (0, length - r.shape[1])) for r in rows])


def compute_advantages(cfg: TrainConfig, minibatches: list[Minibatch]) -> None:
    """Advantages and returns of every minibatch, computed over the whole iteration at
    once (GRPO's groups span minibatches), then whitened over all its action tokens
    (GRPO's scores are normalised within their groups already and are left as they are)."""
    p = cfg.ppo
    estimator = ESTIMATORS[p.estimator]
    mask = _stack([mb.mask for mb in minibatches])
    inputs = AdvantageInputs(
        token_rewards=_stack([mb.token_rewards for mb in minibatches]),
        values=_stack([mb.old_values for mb in minibatches]) if estimator.critic else None,
        loss_mask=mask,
        turn_end=_stack([mb.batch.turn_end for mb in minibatches]),
        episode_rewards=torch.cat([mb.episode_rewards for mb in minibatches]),
        group_ids=torch.cat([mb.seeds for mb in minibatches]),
    )
    advantages, returns = estimator.fn(p, inputs)
    if p.whiten_advantages and estimator.critic:
        advantages = masked_whiten(advantages, mask)
    row = 0
    for mb in minibatches:
        rows, length = mb.mask.shape
        mb.advantages = advantages[row : row + rows, :length].to(mb.mask.device)
        mb.returns = returns[row : row + rows, :length].to(mb.mask.device)
        row += rows


def update(
    cfg: TrainConfig, models: Models, opts: dict[str, torch.optim.Optimizer], mb: Minibatch
) -> dict[str, float]:
    """One gradient step on one minibatch; returns its losses and gradient norms."""
    p = cfg.ppo
    kl_free = p.kl_unmasked and p.kl_in == "loss"
    logp, entropy, values, free_logp = forward(models, mb.batch, cfg.generation.temperature,
                                               kl_free)  # fmt: skip
    losses = ppo_losses(
        logp,
        mb.old_logp,
        mb.advantages,
        entropy,
        mb.mask,
        clip_low=p.clip_low if p.clip_low is not None else p.clip,
        clip_high=p.clip_high if p.clip_high is not None else p.clip,
        agg=p.loss_agg,
        values=values,
        old_values=mb.old_values,
        returns=mb.returns,
        value_clip=p.value_clip,
        ref_logp=mb.ref_logp if p.kl_in == "loss" else None,
        kl_estimator=p.kl_estimator,
        kl_logp=free_logp,
    )
    loss = losses["policy_loss"] - p.entropy_coef * losses["entropy"]
    if "kl_loss" in losses:
        loss = loss + p.kl_coef * losses["kl_loss"]
    if "value_loss" in losses:  # the critic's own optimiser; the head reads detached features
        loss = loss + losses["value_loss"]
    for opt in opts.values():
        opt.zero_grad(set_to_none=True)
    loss.backward()
    trained = models.trained()
    stats = {k: float(v.detach()) for k, v in losses.items()}
    for name, opt in opts.items():
        norm = nn.utils.clip_grad_norm_(trained[name].parameters(), p.max_grad_norm)
        stats[f"grad_norm_{name}"] = as_float(norm)
        opt.step()
    return stats


# ----------------------------------------------------------------------------- logging

PLOTTED = [
    "reward",
    "success",
    "reward_format",
    "observation_score",
    "prediction_score",
    "kl",
    "entropy",
    "value_loss",
    "clip_fraction",
]


def plot_learning_curves(history: list[dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    keys = [k for k in PLOTTED if any(k in m for m in history)]
    if not keys:
        return
    cols = 3
    rows = math.ceil(len(keys) / cols)
    fig, axes = plt.subplots(rows, cols, figsize=(4 * cols, 2.8 * rows), squeeze=False)
    for ax, key in zip(axes.flat, keys, strict=False):
        xs = [m["iteration"] for m in history if key in m]
        ax.plot(xs, [m[key] for m in history if key in m], marker=".")
        ax.set_title(key)
        ax.set_xlabel("iteration")
    for ax in list(axes.flat)[len(keys) :]:
        ax.axis("off")
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)


def rewrite_metrics(out_dir: Path, history: list[dict]) -> None:
    """metrics.jsonl holds exactly the checkpointed iterations (a resumed run may have
    logged an iteration it then lost)."""
    with open(out_dir / "metrics.jsonl", "w") as f:
        for m in history:
            f.write(json.dumps(m) + "\n")


def save_episodes(out_dir: Path, iteration: int, trajectories: list[Any]) -> None:
    """Some of the iteration's sampled episodes, in the file format the play page opens
    and `visenv eval --out` writes (clients.episodes): one file per iteration, so an
    iteration redone after a resume replaces its own."""
    if trajectories:
        lines = [episode_json(t) | {"iteration": iteration} for t in trajectories]
        write_episodes(out_dir / "episodes" / f"iter-{iteration:06d}.jsonl", lines)


def log_metrics(out_dir: Path, writer: Any, metrics: dict[str, Any]) -> None:
    with open(out_dir / "metrics.jsonl", "a") as f:
        f.write(json.dumps(metrics) + "\n")
    for k, v in metrics.items():
        if k != "iteration" and isinstance(v, (int, float)):
            writer.add_scalar(k, v, metrics["iteration"])
    writer.flush()
    log.info(
        "iteration %d: %s",
        metrics["iteration"],
        ", ".join(f"{k}={v:.4g}" for k, v in metrics.items() if isinstance(v, float)),
    )


def episode_metrics(episodes: list[EpisodeTokens]) -> dict[str, float]:
    """The mean of every per-episode number (reward and its parts, success, scores)."""
    keys = sorted({k for e in episodes for k in e.info if k != "seed"})
    return {k: float(np.mean([e.info[k] for e in episodes if k in e.info])) for k in keys}


# ----------------------------------------------------------------------------- the loop


@dataclass
class TrainResult:
    history: list[dict[str, Any]]  # the metrics of every iteration, resumed ones included
    models: Models


def train(cfg: TrainConfig) -> TrainResult:
    """Run PPO as configured; returns the metrics of every iteration and the models."""
    # set-up ------------------------------------------------------------------------
    p, gen = cfg.ppo, cfg.generation
    rank, world = setup_distributed()
    device = torch.device(
        cfg.run.device
        if cfg.run.device != "cuda"
        else f"cuda:{int(os.environ.get('LOCAL_RANK', 0))}"
    )
    make_reproducible(cfg)
    seed_everything(cfg.run.seed)
    out_dir = Path(cfg.run.out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    models = build_models(cfg, device, rank)
    if world > 1:  # before the optimisers: FSDP replaces the parameters with shards
        models.actor = wrap_for_processes(models.actor, cfg.run.parallel)
        if models.critic is not None:
            models.critic = wrap_for_processes(models.critic, cfg.run.parallel)
        if models.reference is not None:
            models.reference = wrap_for_processes(models.reference, cfg.run.parallel, False)
    opts = {"actor": torch.optim.AdamW(
        [w for w in models.actor.parameters() if w.requires_grad], lr=p.actor_lr
    )}  # fmt: skip
    if models.critic is not None:
        opts["critic"] = torch.optim.AdamW(models.critic.parameters(), lr=p.critic_lr)

    # resume --------------------------------------------------------------------------
    start, history = 0, []
    ckpt = latest_checkpoint(out_dir)
    if ckpt is not None:
        state = load_checkpoint(ckpt, models.trained(), opts)
        start, history = int(state["iteration"]) + 1, list(state["history"])
        log.info("resumed from %s: next iteration %d", ckpt, start)
    writer = None
    if rank == 0:
        from torch.utils.tensorboard import SummaryWriter

        writer = SummaryWriter(out_dir / "tensorboard", purge_step=start)
        rewrite_metrics(out_dir, history)

    client = EnvClient(
        cfg.env.servers, transport=cfg.env.transport, token=cfg.env.token, timeout=cfg.env.timeout
    )
    make_policy = policy_factory(
        gen, unwrap(models.actor), models.layout, device, cfg.model.path, models.skeleton
    )
    episode_options = dict(
        config=cfg.env.config,
        format=cfg.env.format,
        representation=cfg.env.representation,
        reasoning=cfg.env.reasoning,
        max_turns=cfg.env.max_turns,
        progress=cfg.run.progress and rank == 0,
    )
    try:
        from tqdm.auto import tqdm

        bar = tqdm(
            range(start, p.iterations),
            desc="PPO",
            disable=not (cfg.run.progress and rank == 0),
            initial=start,
            total=p.iterations,
        )
        for iteration in bar:
            seed_everything(cfg.run.seed * 1_000_003 + iteration * 101 + rank)
            t0 = time.perf_counter()

            # a. collect ------------------------------------------------------------------
            gather_weights(models.actor)
            unwrap(models.actor).eval()
            collected = collect(
                client,
                make_policy,
                cfg.env.name,
                level_seeds(cfg, iteration, rank, world),
                max_attempts=cfg.run.max_episode_attempts,
                retry_wait=cfg.run.retry_wait,
                invalid_penalty=p.invalid_answer_penalty,
                **episode_options,
            )
            resampled, axpo_metrics = [], {}
            if p.axpo:  # all-wrong groups resampled from a fixed reasoning prefix
                resampled, axpo_metrics = axpo_round(
                    cfg, models, client, collected, episode_options, device
                )
            release_weights(models.actor)
            t_rollout = time.perf_counter() - t0
            episodes = collected.episodes + resampled
            metrics: dict[str, Any] = {"iteration": iteration}
            metrics |= episode_metrics(collected.episodes) | axpo_metrics  # as sampled, not AXPO's

            # b. groups (StarPO-S) ----------------------------------------------------------
            if p.group_size > 1:
                kept, group_stats = filter_groups(episodes, p.filter_ratio, p.filter_by)
                metrics |= group_stats
                episodes = kept
            n_episodes = min_over_processes(len(episodes), world)
            if n_episodes == 0:
                raise RuntimeError(
                    f"iteration {iteration}: every episode was lost; are the env servers up?"
                )

            # c. build the batch: old log-probs, reference log-probs, values, rewards ------
            n_minibatches = math.ceil(n_episodes / p.minibatch_size)  # the same on every process
            chunks = np.array_split(np.arange(len(episodes)), n_minibatches)
            minibatches = [
                make_minibatch(cfg, models, [episodes[i] for i in chunk], device)
                for chunk in chunks
            ]

            # d. advantages and returns -----------------------------------------------------
            compute_advantages(cfg, minibatches)

            # e. PPO epochs -----------------------------------------------------------------
            unwrap(models.actor).train()
            stats: dict[str, list[float]] = {}
            for _ in range(p.epochs):
                for i in torch.randperm(len(minibatches)).tolist():
                    for k, v in update(cfg, models, opts, minibatches[i]).items():
                        stats.setdefault(k, []).append(v)

            # f. metrics and checkpoint -----------------------------------------------------
            if p.kl_coef > 0:
                kl = [
                    masked_mean(kl_estimate(mb.old_kl_logp, mb.ref_logp, p.kl_estimator), mb.mask)
                    for mb in minibatches
                ]
                metrics["kl"] = float(np.mean([float(k) for k in kl]))
            metrics |= {
                "episodes": len(collected.episodes),
                "episodes_retried": collected.retried,
                "episodes_dropped": collected.dropped,
                "steps_per_second": sum(e.info["turns"] for e in collected.episodes)
                / max(t_rollout, 1e-9),
                "rollout_seconds": t_rollout,
                "iteration_seconds": time.perf_counter() - t0,
                **{k: float(np.mean(v)) for k, v in stats.items()},
            }
            metrics = mean_over_processes(metrics, world)
            history.append(metrics)
            if rank == 0:
                log_metrics(out_dir, writer, metrics)
                save_episodes(out_dir, iteration, collected.trajectories[: cfg.run.save_episodes])
                plot_learning_curves(history, out_dir / "learning_curves.png")
                bar.set_postfix(
                    reward=f"{metrics.get('reward', 0):.2f}",
                    success=f"{metrics.get('success', 0):.2f}",
                )
            if (iteration + 1) % cfg.run.save_every == 0 or iteration + 1 == p.iterations:
                extra = {"history": history, "config": cfg.model_dump()}
                save_checkpoint(out_dir, iteration, models.trained(), opts, extra, rank)
            if world > 1:
                dist.barrier()
    finally:
        client.close_client()
        if writer is not None:
            writer.close()
    return TrainResult(history, models)
