"""AXPO's resampling of all-wrong groups, through session fork (ppo.axpo: true).

AXPO (Agent eXplorative Policy Optimization, ../shared/reference/axpo-*.txt): when every
rollout of a GRPO group fails, the group's advantages are all zero and it teaches
nothing. AXPO keeps the thinking of one failed rollout fixed and resamples the acting
part from there, so the group gains rollouts that differ exactly where the policy had a
choice to make. Here, after collection, for each level group where no episode succeeded:

1. pick where to branch: the (episode, turn) whose action part (the response after its
   "<answer>" tag) the policy was most uncertain about (mean token entropy, as the paper
   ranks prefixes by uncertainty), or the last turn of the group's first episode
   (`ppo.axpo_branch: last`, also the fallback when no response has an action part);
2. fork the environment there: the branch replays the episode's earlier turns on a new
   session (deterministic levels; `clients.rollout.run_branches`) and forks it;
3. keep the reasoning prefix (the response's tokens up to and including "<answer>")
   fixed and resample the rest of that turn, then play the episode on with the policy;
4. add the new episodes to the group (same level seed). Only the tokens sampled in the
   branch are in the loss: the copied earlier turns and the fixed prefix are context
   (they were trained on in the source episode), so every trained token's old log-prob
   is the sampling policy's, recomputed by the usual pass before the update.

Logged: how many groups were all wrong, how many were resampled, and how many of those
gained a success (`axpo_success_rate`: gained / resampled).
"""

from __future__ import annotations

import copy
import logging
from dataclasses import dataclass
from typing import Any

import torch

from clients import EnvClient
from clients.rollout import PolicyInput, Trajectory

from .rollout import HFPolicy, attach_rewards
from .trajectory import ChatLayout, EpisodeTokens, collate, policy_forward

log = logging.getLogger(__name__)

ANSWER_TAG = "<answer>"


@dataclass
class BranchPoint:
    episode: int  # index into the collected episodes
    turn: int
    prefix_ids: list[int]  # the fixed start of that turn's response
    uncertainty: float  # mean entropy of the resampled part (nan for the "last" rule)


def response_spans(ep: EpisodeTokens) -> list[tuple[int, int]]:
    """[start, end) of each turn's generated tokens, in turn order."""
    spans, start = [], None
    for i, (mask, end) in enumerate(zip(ep.loss_mask, ep.turn_end, strict=True)):
        if mask and start is None:
            start = i
        if end:
            spans.append((i if start is None else start, i + 1))
            start = None
    return spans


def action_prefix(ids: list[int], layout: ChatLayout, tag: str = ANSWER_TAG) -> list[int]:
    """The shortest start of a response's token ids whose text holds the answer tag
    (the reasoning, kept fixed); [] when there is none (the whole response is resampled)."""
    if tag not in layout.tok.decode(ids, skip_special_tokens=True):
        return []
    for k in range(1, len(ids) + 1):
        if tag in layout.tok.decode(ids[:k], skip_special_tokens=True):
            return ids[:k]
    return []


def head_of(ep: EpisodeTokens, turn: int, layout: ChatLayout) -> EpisodeTokens:
    """The tokens of `ep` before turn `turn`'s observation (turn >= 1), none of them in
    the loss (they are context in a branch), with their images."""
    end = [i for i, e in enumerate(ep.turn_end) if e][turn - 1]
    cut = end + 1 + (0 if ep.input_ids[end] == layout.im_end_id else 1) + len(layout.newline)
    vision_start = layout.tok.convert_tokens_to_ids(layout.p.vision_start)
    return EpisodeTokens(
        input_ids=ep.input_ids[:cut],
        loss_mask=[0] * cut,
        turn_end=ep.turn_end[:cut],
        skeleton_state=[-1] * cut,
        skeleton_left=[-1] * cut,
        images=ep.images[: ep.input_ids[:cut].count(vision_start)],
    )


class BranchPolicy(HFPolicy):
    """HFPolicy for branches: each episode starts from `start` (the source's tokens before
    the branch turn), the first response begins with the fixed `prefix_ids` (context, not
    in the loss), and the log-probability of every sampled token under the sampling
    distribution (logits / temperature) is recorded in `sampled_logprobs`."""

    def __init__(self, *args: Any, start: EpisodeTokens | None, prefix_ids: list[int],
                 **kwargs: Any) -> None:  # fmt: skip
        super().__init__(*args, **kwargs)
        self.start = start
        self.prefix_ids = prefix_ids
        self.sampled_logprobs: dict[int, list[list[float]]] = {}

    def __call__(self, batch: list[PolicyInput]) -> list[str]:
        eps, prefixes = [], []
        for inp in batch:
            ep = self.episodes.get(inp.episode)
            first = ep is None  # the branch turn: its response starts with the prefix
            if ep is None:
                ep = self.episodes[inp.episode] = (
                    copy.deepcopy(self.start) if self.start is not None else EpisodeTokens()
                )
                if self.start is None:
                    self.layout.system(ep, inp.system_prompt)
            self.layout.user(
                ep, inp.observation.text, [im.to_array() for im in inp.observation.images]
            )
            prefix = self.prefix_ids if first else []
            ep.extend(prefix)  # fixed: generated from here on, not in the loss
            eps.append(ep)
            prefixes.append(prefix)
        texts: list[str] = []
        for start in range(0, len(eps), self.batch_size):
            chunk = slice(start, start + self.batch_size)
            for inp, ep, generated, logps in zip(
                batch[chunk], eps[chunk], *self.generate_scored(eps[chunk]), strict=True
            ):
                self.layout.response(ep, generated)
                self.sampled_logprobs.setdefault(inp.episode, []).append(logps)
                texts.append(
                    inp.response_prefix
                    + self.layout.tok.decode(generated, skip_special_tokens=True)
                )
        return texts

    @torch.no_grad()
    def generate_scored(self, episodes: list[EpisodeTokens]) -> tuple[list, list]:
        """Sampled ids per episode, and each sampled token's log-prob under the model's
        logits divided by the temperature (what the update's ratio is taken against)."""
        batch = collate(episodes, self.layout.pad_id, self.image_token_id, left_pad=True).to(
            self.device
        )
        out = self.model.generate(
            **batch.model_inputs(),
            max_new_tokens=self.max_new_tokens,
            eos_token_id=self.layout.im_end_id,
            pad_token_id=self.layout.pad_id,
            suppress_tokens=self.suppressed,
            do_sample=True,
            temperature=self.temperature,
            top_k=0,
            top_p=1.0,
            output_logits=True,
            return_dict_in_generate=True,
        )
        prompt_len = batch.input_ids.shape[1]
        logits = torch.stack(out.logits, 1).float() / self.temperature  # (b, new, vocab)
        ids_out, logps_out = [], []
        for row, step_logits in zip(out.sequences[:, prompt_len:], logits, strict=True):
            ids = row.tolist()
            if self.layout.im_end_id in ids:
                ids = ids[: ids.index(self.layout.im_end_id) + 1]
            logp = torch.log_softmax(step_logits[: len(ids)], -1)
            logps_out.append(logp.gather(-1, row[: len(ids), None]).squeeze(-1).tolist())
            ids_out.append(ids)
        return ids_out, logps_out


@torch.no_grad()
def choose_branch(
    episodes: list[EpisodeTokens],
    members: list[int],
    layout: ChatLayout,
    *,
    model: torch.nn.Module | None,
    image_token_id: int,
    temperature: float,
    device: torch.device | str,
    how: str = "uncertainty",
) -> BranchPoint:
    """Where to branch an all-wrong group (see the module docstring)."""
    first = members[0]
    fallback_turn = episodes[first].n_turns - 1
    fallback = BranchPoint(
        first, fallback_turn,
        action_prefix(_span_ids(episodes[first], fallback_turn), layout), float("nan"),
    )  # fmt: skip
    if how == "last" or model is None:
        return fallback
    if how != "uncertainty":
        raise ValueError(f"unknown AXPO branch rule {how!r}; use uncertainty or last")
    batch = collate([episodes[m] for m in members], layout.pad_id, image_token_id).to(device)
    entropy = policy_forward(model, batch, temperature, suppressed=layout.suppressed).entropy
    best: BranchPoint | None = None
    for row, m in enumerate(members):
        for turn, (start, end) in enumerate(response_spans(episodes[m])):
            prefix = action_prefix(episodes[m].input_ids[start:end], layout)
            if not prefix or start + len(prefix) >= end:
                continue  # no action part to resample
            score = float(entropy[row, start + len(prefix) : end].mean())
            if best is None or score > best.uncertainty:
                best = BranchPoint(m, turn, prefix, score)
    return best or fallback


def _span_ids(ep: EpisodeTokens, turn: int) -> list[int]:
    start, end = response_spans(ep)[turn]
    return ep.input_ids[start:end]


def resample_all_wrong(
    client: EnvClient,
    episodes: list[EpisodeTokens],
    trajectories: list[Trajectory],
    policy_args: dict[str, Any],
    *,
    samples: int,
    how: str = "uncertainty",
    temperature: float,
    image_token_id: int,
    episode_options: dict[str, Any],
    invalid_penalty: float = 0.0,
) -> tuple[list[EpisodeTokens], dict[str, float], list[BranchPolicy]]:
    """AXPO over one iteration's collected episodes (aligned with their trajectories).

    policy_args: HFPolicy's arguments (model, layout, temperature, max_new_tokens,
    batch_size, device). Returns the new episodes (with rewards), the metrics, and the
    branch policies (their `sampled_logprobs`, for checks)."""
    layout: ChatLayout = policy_args["layout"]
    groups: dict[int, list[int]] = {}
    for i, traj in enumerate(trajectories):
        groups.setdefault(traj.seed, []).append(i)
    all_wrong = [m for m in groups.values() if not any(trajectories[i].success for i in m)]
    new: list[EpisodeTokens] = []
    policies: list[BranchPolicy] = []
    resampled = gained = 0
    options = {k: v for k, v in episode_options.items() if k != "progress"}
    for members in all_wrong:
        point = choose_branch(
            episodes, members, layout, model=policy_args["model"],
            image_token_id=image_token_id, temperature=temperature,
            device=policy_args.get("device", "cpu"), how=how,
        )  # fmt: skip
        source = trajectories[point.episode]
        start = head_of(episodes[point.episode], point.turn, layout) if point.turn else None
        policy = BranchPolicy(start=start, prefix_ids=point.prefix_ids, **policy_args)
        prefix_text = layout.tok.decode(point.prefix_ids, skip_special_tokens=True)
        branches = client.run_branches(
            policy, source, point.turn, samples, response_prefix=prefix_text,
            on_error="record", **options,
        )  # fmt: skip
        kept = [b for b in branches if b.ok]
        for branch in branches:
            if not branch.ok:
                log.warning("AXPO branch of seed %d failed: %s", source.seed, branch.error)
        new += [attach_rewards(policy.episodes[b.episode], b, invalid_penalty) for b in kept]
        policies.append(policy)
        resampled += bool(kept)
        gained += any(b.success for b in kept)
    metrics = {
        "axpo_groups_all_wrong": float(len(all_wrong)),
        "axpo_groups_resampled": float(resampled),
        "axpo_groups_gained_success": float(gained),
        "axpo_success_rate": gained / resampled if resampled else 0.0,
        "axpo_samples": float(len(new)),
    }
    return new, metrics, policies


def axpo_round(
    cfg: Any, models: Any, client: EnvClient, collected: Any, episode_options: dict[str, Any],
    device: torch.device | str,
) -> tuple[list[EpisodeTokens], dict[str, float]]:  # fmt: skip
    """`resample_all_wrong` as `train` calls it (ppo.axpo), with the run's models and
    generation settings; the new episodes and the metrics."""
    from .distributed import unwrap

    gen = cfg.generation
    policy_args = dict(
        model=unwrap(models.actor), layout=models.layout, temperature=gen.temperature,
        max_new_tokens=gen.max_new_tokens, batch_size=gen.batch_size, device=device,
    )  # fmt: skip
    new, metrics, _ = resample_all_wrong(
        client, collected.episodes, collected.trajectories, policy_args,
        samples=cfg.ppo.axpo_samples or cfg.ppo.group_size, how=cfg.ppo.axpo_branch,
        temperature=gen.temperature, image_token_id=models.image_token_id,
        episode_options=episode_options, invalid_penalty=cfg.ppo.invalid_answer_penalty,
    )  # fmt: skip
    return new, metrics
