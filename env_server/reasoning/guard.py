"""The reward-hacking guard (lives in the API process and sees every session).

A policy that found a response the grader likes too much tends to repeat it. The
guard counts responses (whitespace-normalised) over all sessions, keeping at most
`window` distinct ones (the least frequent is dropped when full). When a response
is among the `top_k` most frequent, has been seen at least `min_count` times and
scores below `threshold`, the turn loses `penalty`:

    guard = ResponseGuard(GuardConfig())
    reply.reward_parts.penalty = -guard.penalty(response_text, score)

`penalty()` returns the amount to subtract (0 or `GuardConfig.penalty`, never
negative); `score` is the turn's reasoning score in [0, 1] (e.g. the mean of the
observation and prediction scores). A disabled guard records nothing.
"""

from __future__ import annotations

import hashlib
import threading
from collections import Counter

from .config import GuardConfig


def response_key(text: str) -> bytes:
    """What the guard counts a response by: a digest of its whitespace-normalised text (a
    worker computes it beside the step, in parallel with the others: `penalty_of_key`)."""
    normalized = " ".join(text.split())
    return hashlib.blake2b(normalized.encode(), digest_size=16).digest()


class ResponseGuard:
    def __init__(self, config: GuardConfig | None = None) -> None:
        self.config = config if config is not None else GuardConfig()
        self._counts: Counter[bytes] = Counter()
        # keys seen exactly once, in first-seen order: in RL almost every response is new,
        # so the one to drop is nearly always the first of these (no scan of the window)
        self._ones: dict[bytes, None] = {}
        # how many keys have each count: ranks a key without sorting the window
        self._freq: Counter[int] = Counter()
        self._lock = threading.Lock()

    def penalty(self, response_text: str, score: float) -> float:
        """Record `response_text`; the penalty to subtract from its turn (0 when none)."""
        if not self.config.enabled:
            return 0.0
        return self.penalty_of_key(response_key(response_text), score)

    def penalty_of_key(self, key: bytes, score: float) -> float:
        """`penalty` of the response whose `response_key` is `key`."""
        cfg = self.config
        if not cfg.enabled:
            return 0.0
        with self._lock:
            if key not in self._counts and len(self._counts) >= cfg.window:
                # drop the least frequent; among equals the oldest (Counter keeps insertion order)
                if self._ones:
                    least = next(iter(self._ones))
                else:
                    least = min(self._counts.items(), key=lambda kv: kv[1])[0]
                self._forget(self._counts.pop(least))
                self._ones.pop(least, None)
            self._counts[key] += 1
            count = self._counts[key]
            self._forget(count - 1)
            self._freq[count] += 1
            if count == 1:
                self._ones[key] = None
            elif count == 2:
                del self._ones[key]
            if count < cfg.min_count or score >= cfg.threshold:
                return 0.0  # no penalty whatever the ranking: skip ranking the window
            return cfg.penalty if self._in_top(key, count, cfg.top_k) else 0.0

    def _forget(self, count: int) -> None:
        if count:
            self._freq[count] -= 1
            if not self._freq[count]:
                del self._freq[count]

    def _in_top(self, key: bytes, count: int, top_k: int) -> bool:
        """Whether `key` is among `most_common(top_k)`, from the count of counts (a few
        distinct values) instead of ranking the whole window; only when the keys tied
        with it straddle the boundary does insertion order decide, as most_common's does."""
        above = sum(n for c, n in self._freq.items() if c > count)
        if above >= top_k:
            return False
        if above + self._freq[count] <= top_k:
            return True
        return key in {k for k, _ in self._counts.most_common(top_k)}

    def copy(self) -> ResponseGuard:
        """An independent guard holding the same window (a forked session's own guard:
        the fork is penalised exactly as its source would be, and neither sees the other's
        later responses)."""
        other = ResponseGuard(self.config)
        with self._lock:
            other._counts = Counter(self._counts)  # same counts, same (insertion) order
            other._ones = dict(self._ones)
            other._freq = Counter(self._freq)
        return other

    def count(self, response_text: str) -> int:
        """How often `response_text` was seen (0 if never, or dropped from the window)."""
        with self._lock:
            return self._counts.get(response_key(response_text), 0)

    def __len__(self) -> int:
        return len(self._counts)
