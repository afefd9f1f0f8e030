"""Grading an agent's description of a navigation state (its `<observation>`/`<prediction>`).

`reasoning/` calls `NavigationEnv.grade_description(text, truth, representation)` with
`truth = json.loads(describe(gt, STRUCTURED))`: object type -> [right, forward] (metres,
agent frame) or a list of them. Navigation has its own reader because its natural words
are egocentric ("2.30 m ahead, slightly to the left"), not grid relations.

Score = F1 between claimed and true objects (matched per type, best credit first):

- structured: the first JSON object in the text; a position earns the share of its two
  axes within `tolerance` metres of the truth;
- natural: per sentence, an object name, a distance ("2.3 m") and a direction word; half
  credit for the direction sector, half for the distance within `tolerance`;
- symbolic: a grid in `describe_symbolic`'s layout (1 m cells, 'A' the agent facing up) with
  its "x = type" legend; a position earns the share of axes within one cell.

`GRADING` is the environment's `GradingSpec` (the agent as anchor, 0.5 m tolerance) and
`state_prompt` tells the agent how to write a state so that this grader reads it.
"""

from __future__ import annotations

import ast
import json
import math
import re
from typing import Any

import numpy as np

from env_server.core import Environment, Representation, StatePrompt
from env_server.core.spatial import GradingSpec

from . import geometry
from .tasks import KINDS

# positions are metres in the agent's frame; a claimed axis within 0.5 m counts
GRADING = GradingSpec(anchor="agent", tolerance=0.5, ignore=())

Claim = tuple[str, Any]  # (type, value): value is (right, forward) or (direction, distance)


def _positions(value: Any) -> list[tuple[float, float]]:
    if (
        isinstance(value, list | tuple)
        and len(value) == 2
        and all(isinstance(v, int | float) for v in value)
    ):
        return [(float(value[0]), float(value[1]))]
    if isinstance(value, list | tuple):
        return [p for v in value for p in _positions(v)]
    return []


def truth_positions(truth: dict[str, Any]) -> dict[str, list[tuple[float, float]]]:
    return {
        _key(k): _positions(v) for k, v in truth.items() if _key(k) != "agent" and _positions(v)
    }


def _key(name: str) -> str:
    return re.sub(r"[\s_-]+", " ", name.strip().lower())


def _f1(credits: float, n_claims: int, n_truth: int) -> float:
    if n_claims == 0 and n_truth == 0:  # nothing to see, nothing claimed: exact
        return 1.0
    if n_claims == 0 or n_truth == 0 or credits <= 0:
        return 0.0
    precision, recall = credits / n_claims, credits / n_truth
    return 2 * precision * recall / (precision + recall)


def _match(claims: dict[str, list[Any]], truth: dict[str, list[Any]], credit) -> float:
    """Sum of credits of a greedy best-first one-to-one matching, per type."""
    total = 0.0
    for name, claimed in claims.items():
        pairs = sorted(
            (
                (credit(c, t), ci, ti)
                for ci, c in enumerate(claimed)
                for ti, t in enumerate(truth.get(name, []))
            ),
            reverse=True,
        )
        used_c: set[int] = set()
        used_t: set[int] = set()
        for value, ci, ti in pairs:
            if ci not in used_c and ti not in used_t:
                used_c.add(ci)
                used_t.add(ti)
                total += value
    return total


def _axes_credit(tolerance: float):
    def credit(claim: tuple[float, float], true: tuple[float, float]) -> float:
        return sum(abs(a - b) <= tolerance + 1e-9 for a, b in zip(claim, true, strict=True)) / 2

    return credit


# ---- readers --------------------------------------------------------------------------------


def parse_structured(text: str) -> dict[str, Any] | None:
    start = text.find("{")
    while start != -1:
        for end in range(len(text), start, -1):
            if text[end - 1] != "}":
                continue
            chunk = text[start:end]
            for loader in (json.loads, ast.literal_eval):
                try:
                    data = loader(chunk.replace("(", "[").replace(")", "]"))
                except (ValueError, SyntaxError, TypeError, MemoryError, RecursionError):
                    continue
                if isinstance(data, dict):
                    return data
        start = text.find("{", start + 1)
    return None


_DISTANCE = re.compile(r"(\d+(?:\.\d+)?)\s*(?:m\b|meters?\b|metres?\b)", re.I)
_SENTENCE = re.compile(r"(?<!\d)\.(?!\d)|[;\n]")
_WORDS = {
    "ahead": ("ahead", "in front", "forward", "straight"),
    "back": ("behind", "back"),
    "left": ("left",),
    "right": ("right",),
}


def _direction_of(sentence: str) -> str | None:
    s = sentence.lower()
    found = {d for d, words in _WORDS.items() if any(re.search(rf"\b{w}\b", s) for w in words)}
    if "ahead" in found and "slightly" in s:  # "ahead, slightly to the left" is still ahead
        found -= {"left", "right"}
    return found.pop() if len(found) == 1 else None


def parse_natural(text: str, names: list[str]) -> dict[str, list[tuple[str | None, float | None]]]:
    """(direction, distance) claims per object name found in each sentence."""
    claims: dict[str, list[tuple[str | None, float | None]]] = {}
    ordered = sorted(names, key=len, reverse=True)
    for sentence in _SENTENCE.split(text):
        low = _key(sentence)
        name = next((n for n in ordered if re.search(rf"\b{re.escape(n)}\b", low)), None)
        if name is None:
            continue
        distance = _DISTANCE.search(sentence)
        claims.setdefault(name, []).append(
            (_direction_of(sentence), float(distance.group(1)) if distance else None)
        )
    return claims


def parse_symbolic(text: str) -> dict[str, list[tuple[float, float]]]:
    lines = text.splitlines()
    rows = [(i, line.split()) for i, line in enumerate(lines)]
    grid = [
        (i, cells)
        for i, cells in rows
        if cells and all(len(c) == 1 for c in cells) and len(cells) >= 3
    ]
    legend = dict(
        re.findall(
            r"(?:^|[\s,])(\S)\s*=\s*([a-zA-Z][a-zA-Z ]*?)\s*(?:\([^)]*\))?\s*(?=,|$)", text, re.M
        )
    )
    agent = next(((r, cells.index("A")) for r, (_, cells) in enumerate(grid) if "A" in cells), None)
    if agent is None:
        return {}
    out: dict[str, list[tuple[float, float]]] = {}
    for r, (_, cells) in enumerate(grid):
        for c, symbol in enumerate(cells):
            if symbol in (".", "A") or symbol not in legend:
                continue
            right = (c - agent[1]) * geometry.SYMBOLIC_CELL
            forward = (agent[0] - r) * geometry.SYMBOLIC_CELL
            out.setdefault(_key(legend[symbol]), []).append((right, forward))
    return out


# ---- the grader -------------------------------------------------------------------------


def grade(text: str, truth: dict[str, Any], representation: str, tolerance: float) -> float:
    true = truth_positions(truth)
    n_truth = sum(len(v) for v in true.values())
    if representation == "structured":
        data = parse_structured(text) or {}
        claims = {k: v for k, v in truth_positions(data).items()}
        credit = _match(claims, true, _axes_credit(tolerance))
    elif representation == "symbolic":
        claims = parse_symbolic(text)
        # objects beyond the grid cannot be drawn: they are not asked for
        true = {
            k: [p for p in v if geometry.symbolic_cell(*p) is not None] for k, v in true.items()
        }
        n_truth = sum(len(v) for v in true.values())
        credit = _match(claims, true, _axes_credit(max(tolerance, geometry.SYMBOLIC_CELL)))
    else:
        # kind names too, so that objects that are not there count against precision
        claims = parse_natural(text, sorted(set(true) | set(KINDS)))

        def natural_credit(
            claim: tuple[str | None, float | None], pos: tuple[float, float]
        ) -> float:
            direction, distance = claim
            score = 0.5 * (direction == geometry.direction(*pos))
            if distance is not None:
                score += 0.5 * (abs(distance - math.hypot(*pos)) <= tolerance + 1e-9)
            return score

        credit = _match(claims, true, natural_credit)
    n_claims = sum(len(v) for v in claims.values())
    return _f1(credit, n_claims, n_truth)


# ---- how the agent is asked to write a state ------------------------------------------------


def state_prompt(env: Environment, representation: Representation) -> StatePrompt:
    """How to write a state in egocentric metres, with a made-up example (before and after
    one 'moveahead') written by `env.describe`."""
    rep = Representation(representation)
    tolerance = GRADING.tolerance
    layout = {"chair": (-0.8, 2.4), "desk": (1.6, 0.6), "box": (-2.0, -0.4)}

    def state(step: float) -> dict[str, Any]:
        entries = [_example_entry(t, r, f - step) for t, (r, f) in layout.items()]
        return {"instruction": "Go to the chair.", "target": entries[0], "objects": entries[1:]}

    where = "<observation> and <prediction> describe the state"
    if rep is Representation.STRUCTURED:
        instruction = (
            f"{where} as one JSON object mapping each object type to its [right, forward] "
            "position in metres from you (you are at [0, 0] facing forward; a negative "
            "right is to your left, a negative forward behind you), or to a list of "
            f"positions when there are several; within {tolerance:g} m counts."
        )
        reminder = "as a JSON object of [right, forward] positions in metres"
    elif rep is Representation.SYMBOLIC:
        instruction = (
            f"{where} as a top-down grid of {geometry.SYMBOLIC_CELL:g} m cells around you, "
            "cells separated by spaces: 'A' is you facing up (the top of the grid is ahead), "
            "'.' an empty cell, 'T' the target and a lower-case letter each other object; "
            "then one legend line such as 'A = you (facing up), T = chair (target), "
            "a = desk'."
        )
        reminder = (
            f"as a grid of {geometry.SYMBOLIC_CELL:g} m cells with 'A' you facing up and a legend"
        )
    else:
        instruction = (
            f"{where} in sentences, one per object, each giving its distance in metres and "
            "its direction from you: ahead, to your left, to your right or behind you (e.g. "
            "'The chair is 2.30 m ahead, slightly to the left.'). A distance within "
            f"{tolerance:g} m counts."
        )
        reminder = "as sentences with each object's distance in metres and direction"
    return StatePrompt.written(
        env,
        rep,
        instruction=instruction,
        reminder=reminder,
        before=state(0.0),
        after=state(0.5),
        answer="moveahead",
    )


def _example_entry(kind: str, right: float, forward: float) -> dict[str, Any]:
    """A made-up visible object at (right, forward) metres, as in the ground truth."""
    return {
        "type": kind,
        "distance": round(float(np.hypot(right, forward)), 2),
        "direction": geometry.direction(right, forward),
        "position": [round(right, 1) + 0.0, round(forward, 1) + 0.0],
        "visible": True,
    }
