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
from transformers import LogitsProcessor
from transformers.cache_utils import Cache, DynamicCache, DynamicLayer

from clients import EnvClient
from clients.errors import VisenvError
from clients.openai_policy import OpenAIPolicy
from clients.rollout import PolicyInput, Trajectory

from .config import GenerationSection
from .skeleton import Skeleton, removed_mass
from .trajectory import ChatLayout, EpisodeTokens, action_log_softmax, collate

log = logging.getLogger(__name__)


class _Slots(DynamicLayer):
    """One layer's keys and values, written into spare room (doubled when full) instead
    of concatenated onto the whole cache at every new token, as DynamicLayer does."""

    _layer_type = None  # not a layer type of its own: never registered in transformers' maps

    def __init__(self, keys: torch.Tensor, values: torch.Tensor) -> None:
        super().__init__()
        self.is_initialized, self.device = True, keys.device
        self.length = keys.shape[-2]
        room = self.length + 64
        self.k_room = keys.new_zeros(*keys.shape[:2], room, keys.shape[3])
        self.v_room = values.new_zeros(*values.shape[:2], room, values.shape[3])
        self.k_room[:, :, : self.length], self.v_room[:, :, : self.length] = keys, values
        self.keys, self.values = keys, values

    def update(self, keys: torch.Tensor, values: torch.Tensor, *args, **kwargs):
        end = self.length + keys.shape[-2]
        if end > self.k_room.shape[-2]:
            more = max(end, 2 * self.k_room.shape[-2]) - self.k_room.shape[-2]
            self.k_room = torch.cat([self.k_room, self.k_room.new_zeros(
                *self.k_room.shape[:2], more, self.k_room.shape[3])], -2)  # fmt: skip
            self.v_room = torch.cat([self.v_room, self.v_room.new_zeros(
                *self.v_room.shape[:2], more, self.v_room.shape[3])], -2)  # fmt: skip
        self.k_room[:, :, self.length : end] = keys
        self.v_room[:, :, self.length : end] = values
        self.length = end
        self.keys, self.values = self.k_room[:, :, :end], self.v_room[:, :, :end]
        return self.keys, self.values

    def get_seq_length(self) -> int:
        return self.length


class TurnCache:
    """Keys and values of every live episode's conversation, kept from turn to turn.

    Each turn, only the tokens an episode added since its last turn (the last sampled
    token, the chat scaffolding, the new observation) go through the model, all live
    episodes in one batch, instead of the whole conversation again. Row r of the cache
    holds episode `rows[r]`; `mask` marks the slots that hold a token (episodes add
    different numbers of tokens, so a batch's shorter rows get empty, masked slots,
    zeroed so they stay finite). Rotary positions count each row's tokens only, so a row
    sees exactly the positions its unpadded sequence has in the update's pass.

    Text-only episodes: a Qwen2.5-VL image needs 3-D positions the cache does not keep.
    """

    def __init__(self, model: torch.nn.Module) -> None:
        self.model = model
        self.rows: list[int] = []
        self.layers: list[_Slots] = []
        self.mask = torch.zeros(0, 0, dtype=torch.long)  # (rows, slots)

    def select(self, keys: list[int], device: torch.device | str) -> None:
        """Keep the rows of `keys`, in that order; an episode not seen yet gets an empty
        row. Slots no kept row uses are dropped."""
        where = {k: i for i, k in enumerate(self.rows)}
        new = [k for k in keys if k not in where]
        where |= {k: len(self.rows) + i for i, k in enumerate(new)}
        self.rows += new
        mask = torch.cat([self.mask.to(device),
                          torch.zeros(len(new), self.mask.shape[1], dtype=torch.long,
                                      device=device)])  # fmt: skip
        index = torch.tensor([where[k] for k in keys], device=device)
        mask = mask[index]
        used = mask.any(0)
        kept = []
        for layer in self.layers:
            k = torch.cat([layer.keys, layer.keys.new_zeros(len(new), *layer.keys.shape[1:])])
            v = torch.cat([layer.values, layer.values.new_zeros(len(new), *layer.values.shape[1:])])
            kept.append(_Slots(k[index][:, :, used], v[index][:, :, used]))
        self.layers, self.mask, self.rows = kept, mask[:, used], list(keys)

    def share(self, rows: list[int], ids: list[int]) -> None:
        """Put the same first tokens `ids` (the system prompt every new episode starts
        with) into the empty rows `rows`, computed once for all of them."""
        once = DynamicCache()
        self.model(input_ids=torch.tensor([ids], device=self.mask.device), cache=once,
                   use_cache=True, logits_to_keep=1)  # fmt: skip
        n, device = len(ids), self.mask.device
        new_mask = torch.zeros(len(self.rows), n, dtype=torch.long, device=device)
        new_mask[rows] = 1
        written = []
        for layer in once.layers:
            k = layer.keys.new_zeros(len(self.rows), *layer.keys.shape[1:])
            v = layer.values.new_zeros(len(self.rows), *layer.values.shape[1:])
            k[rows], v[rows] = layer.keys, layer.values
            written.append((k, v))
        if self.layers:
            for layer, (k, v) in zip(self.layers, written, strict=True):
                layer.update(k, v)
        else:
            self.layers = [_Slots(k, v) for k, v in written]
        self.mask = torch.cat([self.mask, new_mask], 1)

    def seen(self) -> list[int]:
        """How many tokens of each row's sequence the cache holds."""
        return self.mask.sum(1).tolist()

    def forward(self, ids: torch.Tensor, new_mask: torch.Tensor) -> torch.Tensor:
        """Run new tokens (rows, n) through the model on top of the cache, append their keys
        and values; returns the logits after each row's last column (rows, vocab)."""
        positions = self.mask.sum(1, keepdim=True) + new_mask.cumsum(1) - 1
        mask = torch.cat([self.mask, new_mask], 1)
        cache = Cache(layers=self.layers) if self.layers else DynamicCache()
        out = self.model(input_ids=ids, attention_mask=mask, position_ids=positions.clamp_min(0),
                         cache=cache, use_cache=True, logits_to_keep=1)  # fmt: skip
        if not self.layers:
            self.layers = [_Slots(layer.keys, layer.values) for layer in cache.layers]
        empty = (new_mask == 0)[:, None, :, None]
        if empty.any():  # the new empty slots (older ones were zeroed when they were new)
            for layer in self.layers:
                layer.keys[:, :, -ids.shape[1] :].masked_fill_(empty, 0)
                layer.values[:, :, -ids.shape[1] :].masked_fill_(empty, 0)
        self.mask = mask
        return out.logits[:, -1]


def _common_prefix(sequences: list[list[int]]) -> list[int]:
    """The longest start all sequences share, leaving each at least one token of its own."""
    first, n = sequences[0], min(len(x) for x in sequences) - 1
    for x in sequences[1:]:
        n = next((i for i in range(n) if x[i] != first[i]), n)
    return first[:n]


class HFPolicy:
    """Samples responses with a Hugging Face model; remembers every episode's tokens.

    Every turn, all live episodes are sampled together. Text-only episodes go through a
    `TurnCache` (`kv_cache=True`): only each episode's new tokens are computed, and each
    sampled token's log-prob is kept (`logprobs`, per episode and turn) under the
    distribution the update uses (`trajectory.action_log_softmax`: temperature, special
    tokens removed). Episodes with images go through `model.generate` in batches of
    `batch_size`, with the same tokens suppressed.

    With a `skeleton` (the format guard `generation.skeleton`), both ways sample under its
    mask, and each token keeps the automaton's state and the tokens left (for the
    update's log-probs). `unguarded[episode]` holds, per turn, the chance that the
    policy without the mask would have left the skeleton on that turn's path: greedy,
    1.0 if the mask overrode an argmax; sampling, 1 - prod(1 - mass removed) over the
    turn's tokens (the text path only; the image path records nothing)."""

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
        kv_cache: bool = True,
        skeleton: Skeleton | None = None,
    ) -> None:
        self.model = model
        self.layout = layout
        self.temperature = temperature
        self.max_new_tokens = max_new_tokens
        self.batch_size = batch_size
        self.device = device
        self.greedy = greedy
        self.episodes: dict[int, EpisodeTokens] = {}
        self.logprobs: dict[int, list[list[float]]] = {}  # sampled tokens' log-probs (cache only)
        self.image_token_id = layout.tok.convert_tokens_to_ids(layout.p.image_token)
        self.suppressed = layout.suppressed
        self.cache = TurnCache(model) if kv_cache else None
        self.skeleton = skeleton
        self.unguarded: dict[int, list[float]] = {}
        self._decoded: list[list[tuple[int, int]]] = []  # per row: (state, left) per token

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
        if self.cache is not None and not any(ep.images for ep in eps):
            generated = self.generate_cached([inp.episode for inp in batch], eps)
        else:
            generated, self._decoded = [], []
            for start in range(0, len(eps), self.batch_size):
                generated += self.generate(eps[start : start + self.batch_size])
        texts: list[str] = []
        decoded = self._decoded if self.skeleton is not None else [None] * len(eps)
        for ep, ids, skeleton in zip(eps, generated, decoded, strict=True):
            self.layout.response(ep, ids, skeleton)
            texts.append(self.layout.tok.decode(ids, skip_special_tokens=True))
        return texts

    @torch.no_grad()
    def generate_cached(self, keys: list[int], episodes: list[EpisodeTokens]) -> list[list[int]]:
        """One turn of every episode through the cache: the new tokens of all rows at
        once, then one token per step for the rows still answering."""
        cache, pad, end = self.cache, self.layout.pad_id, self.layout.im_end_id
        assert cache is not None
        cache.select(keys, self.device)
        fresh = [row for row, n in enumerate(cache.seen()) if n == 0]
        if len(fresh) > 1:  # new episodes: their common start (the system prompt) once
            shared = _common_prefix([episodes[row].input_ids for row in fresh])
            if shared:
                cache.share(fresh, shared)
        new = [ep.input_ids[n:] for ep, n in zip(episodes, cache.seen(), strict=True)]
        width = max(len(x) for x in new)
        ids = torch.tensor([[pad] * (width - len(x)) + x for x in new], device=self.device)
        mask = torch.tensor([[0] * (width - len(x)) + [1] * len(x) for x in new],
                            device=self.device)  # fmt: skip
        logits = cache.forward(ids, mask)
        out: list[list[int]] = [[] for _ in keys]
        logps: list[list[float]] = [[] for _ in keys]
        answering = torch.ones(len(keys), dtype=torch.bool, device=self.device)
        guard = self.skeleton
        if guard is not None:
            state = torch.full((len(keys),), guard.start, device=self.device)
            kept: list[float] = [1.0] * len(keys)  # chance the unmasked policy kept the skeleton
            self._decoded = [[] for _ in keys]
        for step in range(self.max_new_tokens):
            allowed = None
            if guard is not None:
                left = torch.full_like(state, self.max_new_tokens - step)
                allowed = guard.allowed(state, left)
                free = action_log_softmax(logits, self.temperature, self.suppressed)
                if self.greedy:  # the unmasked argmax taken away: a greedy answer overridden
                    lost = (~allowed.gather(1, free.argmax(-1, keepdim=True))).squeeze(1).float()
                else:
                    lost = removed_mass(free, allowed)
            logp = action_log_softmax(logits, self.temperature, self.suppressed, allowed)
            if self.greedy:
                token = logp.argmax(-1)
            else:
                token = torch.multinomial(logp.exp(), 1).squeeze(1)
            chosen = logp.gather(1, token[:, None]).squeeze(1)
            for row in answering.nonzero().flatten().tolist():
                out[row].append(int(token[row]))
                logps[row].append(float(chosen[row]))
                if guard is not None:
                    self._decoded[row].append((int(state[row]), self.max_new_tokens - step))
                    kept[row] *= 1.0 - float(lost[row])
            if guard is not None:
                state = guard.advance(state, token)
            answering &= token != end
            if step + 1 == self.max_new_tokens or not answering.any():
                break
            # the last sampled token of a row is fed with the row's next turn
            logits = cache.forward(torch.where(answering, token, pad)[:, None],
                                   answering.long()[:, None])  # fmt: skip
        for key, row in zip(keys, logps, strict=True):
            self.logprobs.setdefault(key, []).append(row)
        if guard is not None:
            for key, k in zip(keys, kept, strict=True):
                self.unguarded.setdefault(key, []).append(1.0 - k)
        return out

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
        mask = None
        if self.skeleton is not None:
            mask = _SkeletonMask(self.skeleton, batch.size, self.max_new_tokens)
            sampling["logits_processor"] = [mask]
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
        for i, row in enumerate(out[:, prompt_len:].tolist()):
            if self.layout.im_end_id in row:
                row = row[: row.index(self.layout.im_end_id) + 1]
            results.append(row)
            if mask is not None:
                self._decoded.append([(int(mask.states[k][i]), self.max_new_tokens - k)
                                      for k in range(len(row))])  # fmt: skip
        return results


class _SkeletonMask(LogitsProcessor):
    """The skeleton's mask inside `model.generate` (the image path): each call reads the
    token the last one chose, moves every row's automaton on and masks the next scores;
    `states[k]` keeps every row's state at step k."""

    def __init__(self, skeleton: Skeleton, rows: int, budget: int) -> None:
        self.skeleton, self.budget, self.rows = skeleton, budget, rows
        self.states: list[torch.Tensor] = []

    def __call__(self, input_ids: torch.LongTensor, scores: torch.FloatTensor) -> torch.FloatTensor:
        if self.states:
            state = self.skeleton.advance(self.states[-1], input_ids[:, -1])
        else:
            state = torch.full((self.rows,), self.skeleton.start, device=scores.device)
        self.states.append(state)
        left = torch.full_like(state, self.budget - len(self.states) + 1)
        return scores.masked_fill(~self.skeleton.allowed(state, left), float("-inf"))


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
    skeleton: Skeleton | None = None,
) -> Callable[[], HFPolicy | ServerPolicy]:
    """What makes a fresh rollout policy for `collect`, by `generation.backend`
    (`skeleton`: the format guard's constrained decoding, hf only)."""
    if gen.backend == "hf":
        return lambda: HFPolicy(
            model,
            layout,
            temperature=gen.temperature,
            max_new_tokens=gen.max_new_tokens,
            batch_size=gen.batch_size,
            device=device,
            skeleton=skeleton,
        )
    if skeleton is not None:
        raise ValueError("generation.skeleton needs generation.backend 'hf'")
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


def attach_rewards(
    ep: EpisodeTokens, traj: Trajectory, invalid_penalty: float = 0.0
) -> EpisodeTokens:
    """Copy a finished trajectory's per-turn rewards and summary onto its tokens.

    `invalid_penalty` (the format guard, `ppo.invalid_answer_penalty`) is taken off the
    reward of exactly the turns whose answer was not valid (`info["action_valid"]` false)
    and so off the episode's reward too; `info["invalid_penalty"]` says how much."""
    if ep.n_turns != len(traj.turns):
        raise RuntimeError(
            f"episode {traj.episode}: {ep.n_turns} responses but {len(traj.turns)} turns"
        )
    penalties = [0.0 if t.info.get("action_valid") else invalid_penalty for t in traj.turns]
    ep.turn_rewards = [t.reward - pen for t, pen in zip(traj.turns, penalties, strict=True)]
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
        "reward": traj.total_reward - sum(penalties),
        "success": float(traj.success),
        "turns": len(traj.turns),
        "action_valid": sum(bool(t.info.get("action_valid")) for t in traj.turns)
        / max(1, len(traj.turns)),
        **{f"reward_{k}": v for k, v in parts.items()},
        **{k: sum(v) / len(v) for k, v in scores.items() if v},
    }
    if invalid_penalty:
        ep.info["invalid_penalty"] = sum(penalties)
    return ep


def collect(
    client: EnvClient,
    make_policy,
    env: str,
    seeds: list[int],
    *,
    max_attempts: int = 3,
    retry_wait: float = 1.0,
    invalid_penalty: float = 0.0,
    **episode_options: Any,
) -> Collected:
    """Run one episode per seed; returns the finished ones with their tokens (their
    rewards less `invalid_penalty` on every invalid answer: `attach_rewards`).

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
                ep = attach_rewards(policy.episodes[traj.episode], traj, invalid_penalty)
                unguarded = getattr(policy, "unguarded", {}).get(traj.episode)
                if unguarded:  # the format guard's constrained decoding: what it overrode
                    ep.info["unguarded_break"] = sum(unguarded) / len(unguarded)
                done_eps.append(ep)
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
