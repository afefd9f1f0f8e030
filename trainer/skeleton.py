"""Constrained decoding of a response format's tag skeleton (the format guard
`generation.skeleton`).

A response in one of the paper's formats must hold its tags once each, in order, with
text in every section and nothing but whitespace between the tags (the server's parser,
`env_server/reasoning/formats.py`). `Skeleton` is that language as an automaton over
bytes, lifted to the policy's tokens: at each step of a response only the tokens that
keep it a prefix of a valid skeleton, *and* leave room to close it within the tokens
still allowed, may be sampled:

    <think><observation>TEXT</observation><reasoning>TEXT</reasoning>...</think><answer>TEXT</answer><|im_end|>

What the guard decides and what the policy still chooses:

- the guard fixes the tags: where a tag must come, it is the only thing allowed (a tag
  is often one or two tokens, each then forced; BPE tokens that straddle a section's
  end and the next tag, such as ".</", are allowed like any other prefix);
- the policy chooses everything inside the tags: every word, when a section ends, and
  the answer itself; an action the environment refuses is still refused, and still
  costs the invalid-answer penalty. A section's text may not hold "<" (stricter than
  the parser, which allows a "<" that opens no known tag), and a section counts as
  written once it holds a visible ASCII character;
- the distribution sampled from is the policy's, renormalised over the allowed tokens;
  the update takes every log-prob and entropy under the same mask (each action token
  keeps the automaton's state and the tokens left when it was sampled), so the ratio
  and the KL are those of the policy that acted.

What the guard hides is measured, not assumed: `removed` is the probability the
unmasked policy gave to the tokens the mask took away, and `HFPolicy` reports, per turn,
the chance that the unguarded policy would have left the skeleton on that turn's path.

Every format has a skeleton: the paper's five as the parser reads them, VAGEN main's
(which the server searches for, free text allowed around some tags) in their strictest
form. Byte-level BPE tokenizers (Qwen's, the tiny model's) are read byte by byte, so a
multi-byte character split across tokens is handled; other tokenizers are read through
their decoded text. Special tokens are never allowed, except <|im_end|> after the last
tag. Tables: states x vocabulary (a few hundred states), built once per run.
"""

from __future__ import annotations

import functools

import numpy as np
import torch

from visenv.formats import layout_tags

_WHITESPACE = frozenset(b" \t\n\r\x0b\x0c")  # the parser's \s between tags (ASCII)
# the bytes that make a section non-empty: visible ASCII. The parser strips a section
# with str.strip(), which also takes away control separators and Unicode spaces, so a
# section of those alone would be empty to it; other non-ASCII text is allowed but
# does not count
_VISIBLE = frozenset(range(0x21, 0x7F)) - {ord("<")}
_HIDDEN = bytes(b for b in range(256) if b not in _VISIBLE)  # bytes.translate's delete set
_FAR = 1 << 20  # the distance to the end from a state that cannot reach it


@functools.cache
def _byte_decoder() -> dict[str, int]:
    """GPT-2's byte-level alphabet read backwards: token character -> byte."""
    keep = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1),
            *range(ord("®"), ord("ÿ") + 1)]  # fmt: skip
    chars, extra = {}, 0
    for b in range(256):
        if b in keep:
            chars[chr(b)] = b
        else:
            chars[chr(256 + extra)] = b
            extra += 1
    return chars


def token_bytes(tokenizer, token_id: int) -> bytes:
    """The bytes a token stands for (byte-level BPE read exactly; others decoded)."""
    piece = tokenizer.convert_ids_to_tokens(token_id)
    table = _byte_decoder()
    if piece is not None and piece and all(c in table for c in piece):
        return bytes(table[c] for c in piece)
    return tokenizer.decode([token_id]).encode()


class Skeleton:
    """The tag skeleton of `fmt` as a token automaton; see the module's docstring.

    States: tag j with i of its bytes matched (`i = 0`: the whitespace before it), a
    section's text (empty so far, or not), the whitespace after the last tag, and the end
    (<|im_end|> given). `next[s, t]` is the state after token t from state s (-1: not
    allowed), `dist[s]` the fewest tokens from s to the end."""

    def __init__(
        self,
        tokenizer,
        fmt: str,
        end_id: int,
        vocab_size: int | None = None,
        answer_tag: str = "answer",
    ) -> None:
        """`vocab_size`: the width of the model's logits (Qwen's is wider than its
        tokenizer; ids past the tokenizer are never allowed). `answer_tag`: the session's
        answer tag in VAGEN main's layouts (`reasoning.answer_tag`)."""
        self.fmt = getattr(fmt, "value", fmt)  # a ResponseFormat or its value
        self.tags = [t.encode() for t in layout_tags(self.fmt, answer_tag)]
        # a section's text follows tag j when tag j + 1 closes it: <x>TEXT</x>
        self.text_after = [j + 1 < len(self.tags) and self.tags[j + 1] == b"</" + t[1:]
                           for j, t in enumerate(self.tags)]  # fmt: skip
        self.names: list[tuple] = []
        self.index: dict[tuple, int] = {}
        for j, tag in enumerate(self.tags):
            for i in range(len(tag)):
                self._state(("tag", j, i))
            if self.text_after[j]:
                self._state(("text", j, False))
                self._state(("text", j, True))
        self.after_last = self._state(("after",))
        self.end = self._state(("end",))
        self.start = self.index[("tag", 0, 0)]
        width = vocab_size or len(tokenizer)
        special = set(tokenizer.all_special_ids)
        pieces = [(t, token_bytes(tokenizer, t)) for t in range(min(width, len(tokenizer)))
                  if t not in special]  # fmt: skip
        table = np.full((len(self.names), width), -1, dtype=np.int32)
        for s, t, after in self._transitions([(t, d) for t, d in pieces if d]):
            table[s, t] = after
        if end_id < width:
            table[self.after_last, end_id] = self.end
        self.next = torch.from_numpy(table)
        self.dist = self._distances()
        self._copies: dict[torch.device, tuple[torch.Tensor, torch.Tensor]] = {}

    @classmethod
    def for_model(cls, model, tokenizer, fmt: str, end_id: int, answer_tag: str = "answer"):
        """The skeleton over `model`'s whole logits (`vocab_size` read from its head)."""
        width = model.get_output_embeddings().weight.shape[0]
        return cls(tokenizer, fmt, end_id, vocab_size=width, answer_tag=answer_tag)

    def _transitions(self, pieces: list[tuple[int, bytes]]):
        """(state, token, state after) for every allowed pair. Only the tokens whose first
        byte can go on from a state are read there, and a token without "<" is read in a
        section's text at once, so a 150k vocabulary takes seconds, not minutes."""
        by_first: dict[int, list[tuple[int, bytes]]] = {}
        for t, data in pieces:
            by_first.setdefault(data[0], []).append((t, data))
        gap = [p for b in (*_WHITESPACE, ord("<")) for p in by_first.get(b, [])]
        blank = [p for b in _WHITESPACE for p in by_first.get(b, [])]
        for s, name in enumerate(self.names):
            if name[0] == "text":
                _, j, filled = name
                written, empty = self.index[("text", j, True)], self.index[("text", j, False)]
                for t, data in pieces:
                    if b"<" not in data:
                        yield s, t, written if filled or data.translate(None, _HIDDEN) else empty
                    elif (after := self._read(s, data)) is not None:
                        yield s, t, after
                continue
            if name[0] == "tag":
                _, j, i = name
                candidates = gap if i == 0 else by_first.get(self.tags[j][i], [])
            else:  # after the last tag: whitespace; the end: nothing
                candidates = blank if name[0] == "after" else []
            for t, data in candidates:
                if (after := self._read(s, data)) is not None:
                    yield s, t, after

    def _state(self, name: tuple) -> int:
        self.index[name] = len(self.names)
        self.names.append(name)
        return self.index[name]

    def _tag_done(self, j: int) -> int:
        if self.text_after[j]:
            return self.index[("text", j, False)]
        if j + 1 == len(self.tags):
            return self.after_last
        return self.index[("tag", j + 1, 0)]

    def _read(self, state: int, data: bytes) -> int | None:
        """The state after the bytes `data` from `state`; None if they leave the skeleton."""
        name = self.names[state]
        for b in data:
            kind = name[0]
            if kind == "tag":
                _, j, i = name
                tag = self.tags[j]
                if i == 0 and b in _WHITESPACE:
                    continue
                if b != tag[i]:
                    return None
                name = self.names[self._tag_done(j)] if i + 1 == len(tag) else ("tag", j, i + 1)
            elif kind == "text":
                _, j, filled = name
                if b == ord("<"):
                    if not filled:  # an empty section
                        return None
                    name = ("tag", j + 1, 1)  # the closing tag has begun
                elif not filled and b in _VISIBLE:
                    name = ("text", j, True)
            elif kind == "after":
                if b not in _WHITESPACE:
                    return None
            else:  # the end: nothing follows
                return None
        return self.index[name]

    def _distances(self) -> torch.Tensor:
        """Fewest tokens from each state to the end (`_FAR`: never), by relaxation."""
        dist = torch.full((len(self.names) + 1,), _FAR, dtype=torch.long)  # last: "not allowed"
        dist[self.end] = 0
        nxt = self.next.long()
        nxt[nxt < 0] = len(self.names)
        for _ in range(len(self.names) + 1):
            new = torch.minimum(dist[:-1], 1 + dist[nxt].min(1).values)
            new[self.end] = 0
            if torch.equal(new, dist[:-1]):
                break
            dist[:-1] = new
        return dist.to(torch.int32)  # int32 tables: the update gathers them per logit

    def shortest(self) -> int:
        """The fewest tokens a whole response takes (its tags, one token of text per
        section, <|im_end|>): a generation budget below it cannot close the skeleton."""
        return int(self.dist[self.start])

    def check_budget(self, max_new_tokens: int) -> None:
        if max_new_tokens < self.shortest():
            raise ValueError(
                f"generation.skeleton: the {self.fmt} skeleton takes at least "
                f"{self.shortest()} tokens of this tokenizer, more than "
                f"generation.max_new_tokens={max_new_tokens}"
            )

    def allowed(self, states: torch.Tensor, left: torch.Tensor) -> torch.Tensor:
        """Which tokens may come next (bool, states' shape + (vocab,)): from `states`,
        with `left` tokens allowed in all (this one included), a token is allowed when it
        keeps the skeleton and its state can still reach the end in `left - 1` tokens.
        A state of -1 (a token not under the guard) and the end (a finished response,
        whose row a batch still carries) allow every token."""
        nxt, dist = self._on(states.device)
        after = nxt[states.clamp_min(0)]
        after[after < 0] = len(self.names)
        ok = dist[after] <= (left - 1).unsqueeze(-1)
        return ok | ((states < 0) | (states == self.end)).unsqueeze(-1)

    def advance(self, states: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
        """The states after `tokens` (-1 where a token left the skeleton)."""
        return self._on(states.device)[0][states.clamp_min(0), tokens].long()

    def _on(self, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
        """The tables on `device`, copied there once."""
        if device not in self._copies:
            self._copies[device] = (self.next.to(device), self.dist.to(device))
        return self._copies[device]


def removed_mass(logp_free: torch.Tensor, allowed: torch.Tensor) -> torch.Tensor:
    """The probability the unmasked distribution (log-probs `logp_free`) puts on the
    tokens `allowed` takes away, per row."""
    return logp_free.exp().masked_fill(allowed, 0.0).sum(-1)
