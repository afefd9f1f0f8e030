"""Rollouts: a Hugging Face policy driving remote episodes through the client SDK.

`HFPolicy` is the batch policy handed to `clients`' `run_episodes`: every turn it
lays out each live episode's next observation as tokens (`trajectory.ChatLayout`),
samples all responses in batches with `model.generate`, keeps the sampled token ids
and answers the decoded texts. `collect` runs a set of seeds and pairs every finished
episode's rewards with its tokens. An episode whose session was lost (its server went
away, or a call timed out) is never trained on: it is run again from the start (on
another server when the client has one), up to `max_attempts` times with a back-off,
then dropped; both are counted. Any other failure (e.g. `INVALID_ARGUMENT`) stops the
run with its error: running it again would only fail the same way.

`ServerPolicy` generates with an OpenAI-compatible server instead (vLLM, for speed on
GPUs): it lays out the same tokens, but a response's token ids are its text tokenised
again with the policy's tokenizer (a server answers text), so the server must serve the
current policy weights for the update to be on-policy (docs/trainer.md).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from clients.client import EnvClient
from clients.errors import VisenvError
from clients.openai_policy import OpenAIPolicy
from clients.rollout import PolicyInput, Trajectory

from .config import GenerationSection
from .trajectory import ChatLayout, EpisodeTokens, collate

log = logging.getLogger(__name__)


class HFPolicy:
    """Samples responses with a Hugging Face model; remembers every episode's tokens."""

    def __init__(
        self,
        model: torch.nn.Module,
        layout: ChatLayout,
        *,
        temperature: float,
        max_new_tokens: int,
        batch_size: int,
        device: torch.device | str = "cpu",
        greedy: bool = False,
    ) -> None:
        self.model = model
        self.layout = layout
        self.temperature = temperature
        self.max_new_tokens = max_new_tokens
        self.batch_size = batch_size
        self.device = device
        self.greedy = greedy
        self.episodes: dict[int, EpisodeTokens] = {}
        self.image_token_id = layout.tok.convert_tokens_to_ids(layout.p.image_token)
        # special tokens other than <|im_end|> are never sampled: a stray image or vision
        # token in a response would break the layout of image positions
        special = set(layout.tok.all_special_ids) | set(
            layout.tok.convert_tokens_to_ids(
                [layout.p.image_token, layout.p.vision_start, layout.p.vision_end]
            )
        )
        self.suppressed = sorted(
            i for i in special if i is not None and i != layout.im_end_id and i >= 0
        )

    def __call__(self, batch: list[PolicyInput]) -> list[str]:
        eps = []
        for inp in batch:
            ep = self.episodes.setdefault(inp.episode, EpisodeTokens())
            if inp.turn == 0:
                self.layout.system(ep, inp.system_prompt)
            self.layout.user(
                ep, inp.observation.text, [im.to_array() for im in inp.observation.images]
            )
            eps.append(ep)
        texts: list[str] = []
        for start in range(0, len(eps), self.batch_size):
            chunk = eps[start : start + self.batch_size]
            for ep, generated in zip(chunk, self.generate(chunk), strict=True):
                self.layout.response(ep, generated)
                texts.append(self.layout.tok.decode(generated, skip_special_tokens=True))
        return texts

    @torch.no_grad()
    def generate(self, episodes: list[EpisodeTokens]) -> list[list[int]]:
        batch = collate(episodes, self.layout.pad_id, self.image_token_id, left_pad=True).to(
            self.device
        )
        sampling: dict[str, Any] = (
            {"do_sample": False}
            if self.greedy
            else {"do_sample": True, "temperature": self.temperature, "top_k": 0, "top_p": 1.0}
        )
        out = self.model.generate(
            **batch.model_inputs(),
            max_new_tokens=self.max_new_tokens,
            eos_token_id=self.layout.im_end_id,
            pad_token_id=self.layout.pad_id,
            suppress_tokens=self.suppressed,
            **sampling,
        )
        prompt_len = batch.input_ids.shape[1]
        results = []
        for row in out[:, prompt_len:].tolist():
            if self.layout.im_end_id in row:
                row = row[: row.index(self.layout.im_end_id) + 1]
            results.append(row)
        return results


class ServerPolicy:
    """Samples responses from an OpenAI-compatible server; remembers every episode's tokens.

    A response's ids are its text tokenised with the policy's tokenizer (special-token
    text is split, never read as a special token), plus <|im_end|> when the server
    stopped at it; a response cut off at max_tokens gets none (as with HFPolicy)."""

    def __init__(self, server: OpenAIPolicy, layout: ChatLayout) -> None:
        self.server = server
        self.layout = layout
        self.episodes: dict[int, EpisodeTokens] = {}

    def tokens(self, text: str, finish_reason: str | None) -> list[int]:
        ids = list(
            self.layout.tok(text, add_special_tokens=False, split_special_tokens=True).input_ids
        )
        return ids + [self.layout.im_end_id] if finish_reason == "stop" else ids

    async def __call__(self, batch: list[PolicyInput]) -> list[str | VisenvError]:
        out: list[str | VisenvError] = []
        for inp, answer in zip(batch, await self.server.respond(batch), strict=True):
            if isinstance(answer, VisenvError):  # that episode fails; it is never trained on
                out.append(answer)
                continue
            ep = self.episodes.setdefault(inp.episode, EpisodeTokens())
            if inp.turn == 0:
                self.layout.system(ep, inp.system_prompt)
            self.layout.user(
                ep, inp.observation.text, [im.to_array() for im in inp.observation.images]
            )
            self.layout.response(ep, self.tokens(answer.text, answer.finish_reason))
            out.append(answer.text)
        return out


def policy_factory(
    gen: GenerationSection,
    model: torch.nn.Module,
    layout: ChatLayout,
    device: torch.device | str,
    served_model: str,
) -> Callable[[], HFPolicy | ServerPolicy]:
    """What makes a fresh rollout policy for `collect`, by `generation.backend`."""
    if gen.backend == "hf":
        return lambda: HFPolicy(
            model,
            layout,
            temperature=gen.temperature,
            max_new_tokens=gen.max_new_tokens,
            batch_size=gen.batch_size,
            device=device,
        )
    assert gen.base_url is not None  # checked by the config
    server = OpenAIPolicy(
        gen.base_url,
        gen.served_model or served_model,
        api_key_env=gen.api_key_env,
        temperature=gen.temperature,
        max_tokens=gen.max_new_tokens,
        timeout=gen.timeout,
        max_concurrency=gen.max_concurrency,
        retries=gen.retries,
        # the whole distribution, as the trainer's ratio assumes (no top-k/top-p cut)
        extra_body={"top_p": 1.0, "stop": ["<|im_end|>"]},
    )
    return lambda: ServerPolicy(server, layout)


class EpisodeFailed(RuntimeError):
    """An episode failed for a reason that running it again would not cure (an invalid
    argument, a refused config, ...): training stops with that error."""

    def __init__(self, seed: int, error: VisenvError) -> None:
        super().__init__(f"episode seed {seed} failed: {error}")
        self.seed = seed
        self.error = error


@dataclass
class Collected:
    episodes: list[EpisodeTokens]
    trajectories: list[Trajectory]
    retried: int  # episodes run again after their session was lost
    dropped: int  # episodes given up after max_attempts


def attach_rewards(ep: EpisodeTokens, traj: Trajectory) -> EpisodeTokens:
    """Copy a finished trajectory's per-turn rewards and summary onto its tokens."""
    if ep.n_turns != len(traj.turns):
        raise RuntimeError(
            f"episode {traj.episode}: {ep.n_turns} responses but {len(traj.turns)} turns"
        )
    ep.turn_rewards = [t.reward for t in traj.turns]
    parts: dict[str, float] = {}
    for t in traj.turns:
        for k, v in t.reward_parts.to_dict().items():
            parts[k] = parts.get(k, 0.0) + v
    scores = {
        key: [float(t.info[key]) for t in traj.turns if t.info.get(key) is not None]
        for key in ("observation_score", "prediction_score")
    }
    ep.info = {
        "seed": traj.seed,
        "reward": traj.total_reward,
        "success": float(traj.success),
        "turns": len(traj.turns),
        "action_valid": sum(bool(t.info.get("action_valid")) for t in traj.turns)
        / max(1, len(traj.turns)),
        **{f"reward_{k}": v for k, v in parts.items()},
        **{k: sum(v) / len(v) for k, v in scores.items() if v},
    }
    return ep


def collect(
    client: EnvClient,
    make_policy,
    env: str,
    seeds: list[int],
    *,
    max_attempts: int = 3,
    retry_wait: float = 1.0,
    **episode_options: Any,
) -> Collected:
    """Run one episode per seed; returns the finished ones with their tokens.

    Episodes that failed for a transient reason (`clients.rollout.TRANSIENT`: lost
    session, unreachable server, deadline) are run again after a back-off (`retry_wait`,
    doubling each time), which gives a server the time to replace a dead worker; any
    other failure raises `EpisodeFailed` with the error."""
    pending = list(seeds)
    done_eps: list[EpisodeTokens] = []
    done_trajs: list[Trajectory] = []
    retried = 0
    for attempt in range(max_attempts):
        if not pending:
            break
        if attempt > 0:
            retried += len(pending)
            time.sleep(retry_wait * 2 ** (attempt - 1))
            log.warning("running %d lost episodes again (attempt %d)", len(pending), attempt + 1)
        policy = make_policy()
        trajs = client.run_episodes(policy, env, pending, on_error="record", **episode_options)
        failed = []
        for traj in trajs:
            if traj.ok:
                done_eps.append(attach_rewards(policy.episodes[traj.episode], traj))
                done_trajs.append(traj)
            elif traj.retryable:
                log.warning("episode seed %d lost: %s", traj.seed, traj.error)
                failed.append(traj.seed)
            else:  # the same call would fail the same way again: surface it
                assert traj.error is not None
                raise EpisodeFailed(traj.seed, traj.error) from traj.error
        pending = failed
    if pending:
        log.warning("dropped %d episodes after %d attempts", len(pending), max_attempts)
    return Collected(done_eps, done_trajs, retried, len(pending))
