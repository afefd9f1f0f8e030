"""The response formats' layouts: which tags an agent's response holds, in what order.

This is the contract for the text of a response, below both sides: the server's parser
(`env_server/reasoning/formats.py`) reads responses by it, and the trainer's skeleton
guard (`trainer/skeleton.py`) decodes them by it. Formats are named by their string
values (`env_server.core.types.ResponseFormat`).

- The VAGEN paper's five formats (`SECTIONS`): `<think>` holds these sections in order
  (None: free text), then `<answer>`; no_think is the answer alone.
- VAGEN main's layouts (`VAGEN_LAYOUTS`): tags in order, "answer" standing for the
  session's answer tag, searched for in the response (free text around them, and between
  them where `free_between`), or the whole response where `alone`.
"""

from __future__ import annotations

from dataclasses import dataclass

SECTIONS: dict[str, tuple[str, ...] | None] = {
    "no_think": (),
    "free_think": None,
    "grounding": ("observation", "reasoning"),
    "worldmodeling": ("reasoning", "prediction"),
    "grounding_worldmodeling": ("observation", "reasoning", "prediction"),
}


@dataclass(frozen=True)
class VagenLayout:
    """One of VAGEN main's layouts: its tags in order ("answer" stands for the answer tag),
    whether free text may stand between them, and whether the response must hold nothing else."""

    tags: tuple[str, ...]
    free_between: bool = False
    alone: bool = False


VAGEN_LAYOUTS: dict[str, VagenLayout] = {
    "vagen_free_think": VagenLayout(("think", "answer")),
    "vagen_wm": VagenLayout(("observation", "think", "answer", "prediction")),
    "vagen_free_wm": VagenLayout(("observation", "answer", "prediction"), free_between=True),
    "vagen_no_think": VagenLayout(("answer",), alone=True),
    "vagen_eval_mode": VagenLayout(("answer",)),
}


def expected_tags(fmt: str) -> list[str]:
    """The tags a response in one of the paper's formats must hold, in order:
    ['<think>', ..., '</answer>']."""
    sections = SECTIONS[fmt]
    tags: list[str] = []
    if sections != ():
        tags.append("<think>")
        for s in sections or ():
            tags += [f"<{s}>", f"</{s}>"]
        tags.append("</think>")
    return tags + ["<answer>", "</answer>"]


def layout_tags(fmt: str, answer_tag: str = "answer") -> list[str]:
    """The tags of a response in any format, in order. VAGEN main's layouts get their
    strictest form: each tag pair once, nothing between the pairs."""
    if fmt in VAGEN_LAYOUTS:
        names = [answer_tag if t == "answer" else t for t in VAGEN_LAYOUTS[fmt].tags]
        return [tag for name in names for tag in (f"<{name}>", f"</{name}>")]
    if fmt not in SECTIONS:
        raise ValueError(f"unknown response format {fmt!r}")
    return expected_tags(fmt)
