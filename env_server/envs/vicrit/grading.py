"""How vicrit grades `<observation>` and `<prediction>`: its states are a caption's error,
not positions, so `reasoning/`'s grid grader does not apply (`grading = None`); a text
earns the share of the true words (what the image shows where the caption is wrong) it
names (`VicritEnv.grade_description`)."""

from __future__ import annotations

from typing import Any

from . import caption as cap

_STOPWORDS = {"a", "an", "and", "the", "of", "to", "in", "on", "is", "are", "with", "by"}


def words(text: str) -> set[str]:
    """The graded words of `text`: its tokens, stop words left out."""
    return set(cap.tokens(text)) - _STOPWORDS


def grade(text: str, truth: dict[str, Any]) -> float:
    """The share of the true words (`truth["original"]`, the span as the image has it)
    that `text` names. A JSONL item without its true words can't be graded: ValueError,
    reported as `grading_error`, never a 0."""
    wanted = words(truth.get("original") or "")
    if not wanted:
        raise ValueError("this item does not say what the image truly shows ('original')")
    return len(wanted & words(text)) / len(wanted)
