"""Whole episodes as token sequences, and the model passes over them.

An episode is laid out in Qwen's chat format (ChatML), one turn after another:

    <|im_start|>system\\n{system prompt}<|im_end|>\\n   (left out with `system_prompt=False`)
    <|im_start|>user\\n{observation, each <image> as <|vision_start|><|image_pad|>*n<|vision_end|>}<|im_end|>\\n
    <|im_start|>assistant\\n{the agent's generated tokens}<|im_end|>\\n
    ... (next turn)

Only the agent's own generated tokens are in the loss mask (never the system prompt,
observations, image tokens or the chat scaffolding); the last generated token of each
response is its turn-end token, where that turn's reward is placed. The generated
token ids are kept exactly as sampled (never re-tokenised from text), so the
sequence trained on is the one the policy produced.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, NamedTuple

import numpy as np
import torch
import torch.nn.functional as F

from .model import Processing
from .skeleton import Skeleton


@dataclass
class EpisodeTokens:
    """One episode's token sequence, built turn by turn."""

    input_ids: list[int] = field(default_factory=list)
    loss_mask: list[int] = field(default_factory=list)
    turn_end: list[int] = field(default_factory=list)
    # constrained decoding (`skeleton.Skeleton`): per token, the automaton's state it was
    # sampled in and the tokens its response had left then; -1 for every other token
    skeleton_state: list[int] = field(default_factory=list)
    skeleton_left: list[int] = field(default_factory=list)
    # per image, in order: (pixel_values (patches, dim), grid_thw (3,))
    images: list[tuple[torch.Tensor, torch.Tensor]] = field(default_factory=list)
    # filled once the episode is over
    turn_rewards: list[float] = field(default_factory=list)
    info: dict[str, Any] = field(default_factory=dict)

    def extend(
        self, ids: list[int], agent: bool = False, skeleton: list[tuple[int, int]] | None = None
    ) -> None:
        self.input_ids += ids
        self.loss_mask += [1 if agent else 0] * len(ids)
        self.turn_end += [0] * len(ids)
        pairs = skeleton or [(-1, -1)] * len(ids)
        self.skeleton_state += [s for s, _ in pairs]
        self.skeleton_left += [n for _, n in pairs]

    @property
    def n_turns(self) -> int:
        return sum(self.turn_end)

    def token_rewards(self, placement: str = "turn") -> list[float]:
        """The turn rewards at their turn-end tokens ("turn"), or their sum at the last
        turn-end token ("episode", VAGEN-Base)."""
        out = [0.0] * len(self.input_ids)
        ends = [i for i, e in enumerate(self.turn_end) if e]
        if len(ends) != len(self.turn_rewards):
            raise ValueError(f"{len(ends)} turn ends but {len(self.turn_rewards)} turn rewards")
        if placement == "turn":
            for i, r in zip(ends, self.turn_rewards, strict=True):
                out[i] = r
        elif placement == "episode" and ends:
            out[ends[-1]] = float(sum(self.turn_rewards))
        return out


class ChatLayout:
    """Writes chat segments as token ids with a tokenizer and an image processor."""

    def __init__(self, processing: Processing, *, system_prompt: bool = True) -> None:
        self.p = processing
        # False: the environment's system prompt is left out of the policy's context
        # (config `env.system_prompt`); every writer of an episode calls `system()`, so
        # rollouts, the update's passes and supervised data built with this layout agree
        self.system_prompt = system_prompt
        tok = processing.tokenizer
        self.tok = tok
        self.im_end_id = tok.convert_tokens_to_ids("<|im_end|>")
        self.newline = self._ids("\n")
        self.pad_id = tok.pad_token_id if tok.pad_token_id is not None else self.im_end_id
        # special tokens other than <|im_end|> never exist in a response: a stray image or
        # vision token would break the layout of image positions. Sampling removes them,
        # and so does every log-prob the update takes (`action_log_softmax`), so the policy
        # trained is the one sampled from.
        special = set(tok.all_special_ids) | set(
            tok.convert_tokens_to_ids(
                [processing.image_token, processing.vision_start, processing.vision_end]
            )
        )
        self.suppressed = sorted(
            i for i in special if i is not None and i != self.im_end_id and i >= 0
        )

    def _ids(self, text: str) -> list[int]:
        return list(self.tok(text, add_special_tokens=False).input_ids)

    def image(self, image: np.ndarray) -> tuple[torch.Tensor, torch.Tensor, int]:
        out = self.p.image_processor(images=[image], return_tensors="pt")
        grid = out["image_grid_thw"][0]
        n_tokens = int(grid.prod()) // self.p.merge_size**2
        return out["pixel_values"], grid, n_tokens

    def system(self, ep: EpisodeTokens, text: str) -> None:
        """The system message; nothing when this layout leaves the system prompt out."""
        if self.system_prompt:
            ep.extend(self._ids(f"<|im_start|>system\n{text}<|im_end|>\n"))

    def user(self, ep: EpisodeTokens, text: str, images: list[np.ndarray]) -> None:
        """A user message and the assistant header that opens the agent's reply."""
        pieces = text.split("<image>")
        if len(pieces) - 1 != len(images):
            raise ValueError(
                f"observation has {len(pieces) - 1} <image> placeholders but {len(images)} images"
            )
        parts = ["<|im_start|>user\n"]
        for i, piece in enumerate(pieces):
            parts.append(piece)
            if i < len(images):
                pixels, grid, n = self.image(images[i])
                ep.images.append((pixels, grid))
                parts.append(self.p.vision_start + self.p.image_token * n + self.p.vision_end)
        parts.append("<|im_end|>\n<|im_start|>assistant\n")
        ep.extend(self._ids("".join(parts)))

    def response(
        self, ep: EpisodeTokens, generated: list[int], skeleton: list[tuple[int, int]] | None = None
    ) -> None:
        """The agent's generated tokens (loss mask 1, the last one its turn end), then
        the scaffolding that closes the message (an <|im_end|> only if it was cut off).
        `skeleton`: each token's (state, tokens left) under constrained decoding."""
        if not generated:
            generated = [self.im_end_id]  # an empty answer still ends its turn
        ep.extend(generated, agent=True, skeleton=skeleton)
        ep.turn_end[-1] = 1
        tail = ([] if generated[-1] == self.im_end_id else [self.im_end_id]) + self.newline
        ep.extend(tail)


@dataclass
class Batch:
    """Episodes padded into (batch, tokens) tensors, ready for a model pass."""

    input_ids: torch.Tensor
    attention_mask: torch.Tensor
    loss_mask: torch.Tensor
    turn_end: torch.Tensor
    token_rewards: torch.Tensor  # turn rewards only (the KL penalty is added later)
    pixel_values: torch.Tensor | None
    image_grid_thw: torch.Tensor | None
    image_token_id: int
    # constrained decoding: each token's automaton state and tokens left (-1: none)
    skeleton_state: torch.Tensor | None = None
    skeleton_left: torch.Tensor | None = None

    @property
    def size(self) -> int:
        return self.input_ids.shape[0]

    def model_inputs(self) -> dict[str, Any]:
        inputs: dict[str, Any] = {
            "input_ids": self.input_ids,
            "attention_mask": self.attention_mask,
        }
        if self.pixel_values is not None:
            inputs["pixel_values"] = self.pixel_values
            inputs["image_grid_thw"] = self.image_grid_thw
            inputs["mm_token_type_ids"] = (self.input_ids == self.image_token_id).int()
        return inputs

    def to(self, device: torch.device | str) -> Batch:
        moved = {
            k: (v.to(device) if isinstance(v, torch.Tensor) else v)
            for k, v in self.__dict__.items()
        }
        return Batch(**moved)


def collate(
    episodes: list[EpisodeTokens],
    pad_id: int,
    image_token_id: int,
    placement: str = "turn",
    left_pad: bool = False,
) -> Batch:
    """Pad episodes (right by default; left for generation) into one Batch."""
    length = max(len(e.input_ids) for e in episodes)

    def pad(rows: list[list], value, dtype) -> torch.Tensor:
        out = torch.full((len(rows), length), value, dtype=dtype)
        for i, row in enumerate(rows):
            if left_pad:
                out[i, length - len(row) :] = torch.tensor(row, dtype=dtype)
            else:
                out[i, : len(row)] = torch.tensor(row, dtype=dtype)
        return out

    ids = pad([e.input_ids for e in episodes], pad_id, torch.long)
    attn = pad([[1] * len(e.input_ids) for e in episodes], 0, torch.long)
    loss = pad([e.loss_mask for e in episodes], 0, torch.long)
    ends = pad([e.turn_end for e in episodes], 0, torch.long)
    if all(len(e.turn_rewards) == e.n_turns for e in episodes):
        rewards = pad([e.token_rewards(placement) for e in episodes], 0.0, torch.float32)
    else:  # a prompt still being generated has no rewards yet
        rewards = torch.zeros_like(ids, dtype=torch.float32)
    images = [im for e in episodes for im in e.images]
    pixels = torch.cat([p for p, _ in images]) if images else None
    grids = torch.stack([g for _, g in images]) if images else None
    state = left = None
    if any(s >= 0 for e in episodes for s in e.skeleton_state):
        state = pad([e.skeleton_state for e in episodes], -1, torch.long)
        left = pad([e.skeleton_left for e in episodes], -1, torch.long)
    return Batch(ids, attn, loss, ends, rewards, pixels, grids, image_token_id, state, left)


# a finite stand-in for -inf: exp() of it is exactly 0 in float32, and unlike -inf it
# gives no NaN in 0 * log(0) (the entropy) or in its gradient
_REMOVED = -1e9


def action_log_softmax(
    logits: torch.Tensor,
    temperature: float,
    suppressed: Sequence[int] = (),
    allowed: torch.Tensor | None = None,
) -> torch.Tensor:
    """log pi over the vocabulary, exactly as sampled from: the logits divided by the
    temperature, with the `suppressed` token ids removed (probability 0), and under
    constrained decoding every token `allowed` (bool, logits' shape) is False for. The
    sampler (`rollout.HFPolicy`) and the update (`token_logprobs_and_entropy`) both use it."""
    logits = logits.float() / temperature
    if len(suppressed):
        index = torch.as_tensor(suppressed, device=logits.device)
        logits = logits.index_fill(-1, index, _REMOVED)
    if allowed is not None:
        logits = logits.masked_fill(~allowed, _REMOVED)
    return F.log_softmax(logits, dim=-1)


def token_logprobs_and_entropy(
    logits: torch.Tensor,
    input_ids: torch.Tensor,
    temperature: float,
    suppressed: Sequence[int] = (),
    allowed: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Log-probability of each token under the logits of the position before it, and the
    entropy there; position 0 (never an action token) gets 0. The distribution is the
    one sampled from (`action_log_softmax`: temperature, suppressed tokens removed, and
    under constrained decoding only the tokens `allowed[:, t]` for token t + 1)."""
    logp_all = action_log_softmax(logits[:, :-1], temperature, suppressed, allowed)
    entropy = -(logp_all.exp() * logp_all).sum(-1)
    return _at_tokens(logp_all, input_ids), torch.cat(
        [torch.zeros_like(entropy[:, :1]), entropy], 1
    )


def _at_tokens(logp_all: torch.Tensor, input_ids: torch.Tensor) -> torch.Tensor:
    """The log-prob of each token t + 1 from position t's distribution, 0 at position 0."""
    logp = logp_all.gather(-1, input_ids[:, 1:, None]).squeeze(-1)
    return torch.cat([torch.zeros_like(logp[:, :1]), logp], 1)


class PolicyOut(NamedTuple):
    logp: torch.Tensor  # (batch, T): each token's log-prob as sampled (0 at position 0)
    entropy: torch.Tensor  # (batch, T): the entropy there
    hidden: torch.Tensor | None  # the last hidden state, with want_hidden
    free_logp: torch.Tensor | None  # with free=True: logp without the skeleton's mask


def policy_forward(
    model: torch.nn.Module,
    batch: Batch,
    temperature: float,
    want_hidden: bool = False,
    suppressed: Sequence[int] = (),
    skeleton: Skeleton | None = None,
    free: bool = False,
) -> PolicyOut:
    """Token log-probs and entropies of a batch of episodes, under the current weights;
    `suppressed`: the token ids sampling never gives (`ChatLayout.suppressed`);
    `skeleton`: the constrained decoding the batch's responses were sampled under (each
    token's log-prob is then taken under the mask it was sampled with); `free`: also each
    token's log-prob without that mask (what the policy writes by itself: a forced token
    has log-prob 0 under the mask, but not here), from the same logits."""
    out = model(**batch.model_inputs(), use_cache=False, output_hidden_states=want_hidden)
    allowed = None
    if skeleton is not None and batch.skeleton_state is not None:
        assert batch.skeleton_left is not None
        allowed = skeleton.allowed(batch.skeleton_state[:, 1:], batch.skeleton_left[:, 1:])
    logp, entropy = token_logprobs_and_entropy(
        out.logits, batch.input_ids, temperature, suppressed, allowed
    )
    free_logp = None
    if free:
        free_logp = logp
        if allowed is not None:  # no entropy: only the log-probs of the tokens are read
            free_all = action_log_softmax(out.logits[:, :-1], temperature, suppressed)
            free_logp = _at_tokens(free_all, batch.input_ids)
    hidden = out.hidden_states[-1] if want_hidden else None
    return PolicyOut(logp, entropy, hidden, free_logp)
