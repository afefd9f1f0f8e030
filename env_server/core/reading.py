"""Reading descriptions of states and scoring them against a truth: the reading side of
`core.spatial`'s vocabulary.

Environments write their descriptions with `core.spatial`'s words; these readers take a
description back apart and score it against the state it describes. `reasoning/grading.py`
grades an agent's `<observation>` and `<prediction>` with them (and caches what it derives
from a truth that is graded many times); environments may check their own text with them
too (vicrit verifies its captions with `grade_natural` and `score_items`).

The truth is a flat dict from an object type to one position or a list of positions, e.g.

    {"player": [1, 2], "box": [[2, 3]], "target": [[4, 3]], "wall": [[0, 0], ...]}

Other values are graded as attributes: strings, numbers and lists of them
(navigation's `"direction": "left"`, `"distance": 2.5`); nested dicts are
flattened with dotted keys. Types in `GradingSpec.ignore` are never graded.

A description is read in one of three representations:

- `structured`: the first JSON object in the text (tuples "(1, 2)" and single quotes
  are accepted), read the same way as the truth;
- `symbolic`: the longest block of lines written in the grid symbols of
  `GradingSpec.symbols`; each cell gives the object types standing on it at [row, col];
- `natural`: sentences relating objects to the anchor ("The box is below and to the
  right of the player", "The hole is Up and Left of me"), in `core.spatial`'s words
  and the usual synonyms (up/down/left/right, above/below, same row/column).

Score = F1 between claimed and true items, matched per object type with the
Hungarian algorithm. A matched pair earns partial credit: for positions, the share
of axes within `GradingSpec.tolerance`; for natural relations, 0.5 per correct axis
(vertical, horizontal). Relations between two non-anchor objects ("the target is
right of the box") are checked too, and count toward precision only. A description
with no gradable claim scores 0.

The `grade_*` functions work out the truth's items (or relations) on each call unless
they are handed in (`truth_items`, `known`), which is how a caller caches them.
"""

from __future__ import annotations

import ast
import functools
import json
import re
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import numpy as np
from scipy.optimize import linear_sum_assignment

from .spatial import HORIZONTAL, SAME_COLUMN, SAME_ROW, VERTICAL, GradingSpec

Value = tuple[float, ...] | str | float | bool


@dataclass(frozen=True)
class Item:
    """One gradable fact: a position of an object type, or an attribute value."""

    key: str
    value: Value


@dataclass(frozen=True)
class Relation:
    """A claim that `subject` is at (vertical, horizontal) relative to `ref`.

    An axis is None when the text contradicts itself on it ("up ... down").
    """

    subject: str
    ref: str
    vertical: str | None
    horizontal: str | None


# what `true_relations` works out from a truth: positions per object type, the relation of
# each non-anchor object to the anchor per type, and how many such relations there are
TrueRelations = tuple[dict[str, list[tuple[float, ...]]], dict[str, list[tuple[str, str]]], int]


# ---- items ---------------------------------------------------------------------


# the unions made once: `isinstance(x, int | float)` builds its union at every call (~0.1 us
# of ~0.15), and grading a new state checks ~20 values
_NUMBER = int | float
_SEQUENCE = list | tuple


def _is_number(x: Any) -> bool:
    return isinstance(x, _NUMBER) and not isinstance(x, bool)


def _is_position(x: Any) -> bool:
    return isinstance(x, _SEQUENCE) and len(x) > 0 and all(map(_is_number, x))


def state_items(state: dict[str, Any], spec: GradingSpec) -> list[Item]:
    """The gradable items of a state dict (truth or claim), walls and other ignored types left out."""
    items: list[Item] = []
    for key, value in state.items():
        _add_items(items, spec, normalize_key(str(key)), value)
    return items


def _add_items(items: list[Item], spec: GradingSpec, key: str, value: Any) -> None:
    """The items of `value` under `key`, appended to `items`. (A module function: a nested
    one that calls itself is a reference cycle per call, left to the garbage collector.)"""
    if key in spec.ignore or value is None:
        return
    if isinstance(value, dict):
        for sub, v in value.items():
            _add_items(items, spec, f"{key}.{normalize_key(str(sub))}", v)
    elif _is_position(value):
        items.append(Item(key, tuple(map(float, value))))
    elif isinstance(value, _SEQUENCE):
        for v in value:
            _add_items(items, spec, key, v)
    elif isinstance(value, str):
        items.append(Item(key, value.strip().lower()))
    elif isinstance(value, bool) or _is_number(value):
        items.append(Item(key, value))


_KEY_SEPARATORS = re.compile(r"[\s-]+")


@functools.lru_cache(maxsize=4096)
def normalize_key(key: str) -> str:
    return _KEY_SEPARATORS.sub("_", key.strip().lower())


# ---- matching ------------------------------------------------------------------


def item_credit(claim: Value, truth: Value, tolerance: float) -> float:
    """Credit in [0, 1] for `claim` standing for `truth` (same object type)."""
    if isinstance(claim, tuple) and isinstance(truth, tuple):
        if len(claim) != len(truth):
            return 0.0
        close = sum(abs(a - b) <= tolerance + 1e-9 for a, b in zip(claim, truth, strict=True))
        return close / len(truth)
    if isinstance(claim, str) or isinstance(truth, str):
        return float(str(claim).lower() == str(truth).lower())
    if isinstance(claim, bool) or isinstance(truth, bool):
        return float(claim == truth)
    return float(abs(float(claim) - float(truth)) <= tolerance + 1e-9)


def matched_credit(claims: list[Any], truths: list[Any], credit) -> float:
    """The largest total credit of a one-to-one matching (Hungarian algorithm)."""
    if not claims or not truths:
        return 0.0
    if len(claims) == 1:  # a one-row assignment: the best single pair
        return float(max(credit(claims[0], t) for t in truths))
    if len(truths) == 1:
        return float(max(credit(c, truths[0]) for c in claims))
    matrix = np.array([[credit(c, t) for t in truths] for c in claims])
    rows, cols = linear_sum_assignment(matrix, maximize=True)
    return float(matrix[rows, cols].sum())


def f1(credit: float, n_claims: int, n_truth: int) -> float:
    """F1 from a total matched credit; nothing claimed about an empty truth is perfect."""
    if n_claims == 0 and n_truth == 0:
        return 1.0
    return 2.0 * credit / (n_claims + n_truth)


def score_items(claims: list[Item], truth: list[Item], spec: GradingSpec) -> float:
    """F1 of claimed items against true items, matched per key."""
    total = 0.0
    for key in {c.key for c in claims}:
        mine = [c.value for c in claims if c.key == key]
        theirs = [t.value for t in truth if t.key == key]
        total += matched_credit(mine, theirs, lambda a, b: item_credit(a, b, spec.tolerance))
    return f1(total, len(claims), len(truth))


# ---- structured ----------------------------------------------------------------


def parse_structured(text: str) -> dict[str, Any] | None:
    """The first JSON object in `text` (lenient: fences, tuples, single quotes), or None."""
    start = text.find("{")
    end = text.rfind("}")
    if start < 0 or end < start:
        return None
    body = text[start : end + 1]
    candidates = [body, re.sub(r"\(([^()]*)\)", r"[\1]", body)]
    for candidate in candidates:
        for loads in (json.loads, ast.literal_eval):
            try:
                value = loads(candidate)
            except (ValueError, SyntaxError, TypeError, MemoryError, RecursionError):
                continue
            if isinstance(value, dict):
                return value
    return None


def canonical_keys(claimed: dict[str, Any], known: Iterable[str]) -> dict[str, Any]:
    """Map claimed keys onto known keys ('Boxes' -> 'box'); unknown keys are kept as they are."""
    known = set(known)
    out: dict[str, Any] = {}
    for key, value in claimed.items():
        k = normalize_key(str(key))
        for candidate in (k, k.removesuffix("es"), k.removesuffix("s")):
            if candidate in known:
                k = candidate
                break
        if k in out:  # two spellings of one key: keep both claims
            out[k] = _as_list(out[k]) + _as_list(value)
        else:
            out[k] = value
    return out


def _as_list(value: Any) -> list[Any]:
    if _is_position(value) or not isinstance(value, _SEQUENCE):
        return [value]
    return list(value)


def grade_structured(
    text: str, truth: dict[str, Any], spec: GradingSpec, truth_items: list[Item] | None = None
) -> float:
    """Score of the first JSON object in `text` against `truth` (0 when there is none)."""
    claimed = parse_structured(text)
    if truth_items is None:
        truth_items = state_items(truth, spec)
    if claimed is None:
        return 0.0
    claimed = canonical_keys(claimed, truth.keys())
    return score_items(state_items(claimed, spec), truth_items, spec)


# ---- symbolic ------------------------------------------------------------------


def parse_symbolic(text: str, spec: GradingSpec) -> dict[str, list[list[int]]]:
    """Object positions read from the longest block of grid lines in `text`."""
    rows = _grid_rows(text, spec)
    found: dict[str, list[list[int]]] = {}
    for r, row in enumerate(rows):
        for c, symbol in enumerate(row):
            for obj in spec.symbols.get(symbol, ()):
                found.setdefault(obj, []).append([r, c])
    return found


def _grid_rows(text: str, spec: GradingSpec) -> list[list[str]]:
    symbols = spec.symbols
    single = all(len(s) == 1 for s in symbols)
    best: list[list[str]] = []
    run: list[list[str]] = []
    for line in text.splitlines() + [""]:
        line = line.strip().strip("`")
        cells = [ch for ch in line if ch != " " or " " in symbols] if single else line.split()
        known = sum(cell in symbols for cell in cells)
        if cells and known / len(cells) >= 0.8:
            run.append(cells)
            continue
        if len(run) > len(best):
            best = run
        run = []
    return best


def grade_symbolic(
    text: str, truth: dict[str, Any], spec: GradingSpec, truth_items: list[Item] | None = None
) -> float:
    """Score of the grid drawn in `text` (in `spec.symbols`) against `truth`."""
    if not spec.symbols:
        raise ValueError("this environment has no symbolic representation (GradingSpec.symbols)")
    claimed = parse_symbolic(text, spec)
    if truth_items is None:
        truth_items = state_items(truth, spec)
    return score_items(state_items(claimed, spec), truth_items, spec)


# ---- natural -------------------------------------------------------------------

_WORDS = {
    VERTICAL[0]: r"up|upward|upwards|above|upper|top|north|higher",
    VERTICAL[1]: r"down|downward|downwards|below|beneath|under|underneath|lower|bottom|south",
    HORIZONTAL[0]: r"left|west",
    HORIZONTAL[1]: r"right|east",
    SAME_ROW: r"same row|same horizontal line|horizontally aligned",
    SAME_COLUMN: r"same column|same vertical line|vertically aligned",
    "same": r"same (?:position|cell|square|spot|location|place|tile)",
}
_WORD_RE = {k: re.compile(rf"\b(?:{v})\b", re.IGNORECASE) for k, v in _WORDS.items()}
_ANCHOR_ALIASES = r"i|me|my|myself|you|your|yourself|agent"
_REF_BEFORE = re.compile(
    r"(?:\bof|\bfrom|\bto|\bthan|\bwith|\bbeside|\bnear)\s+(?:the\s+|a\s+|an\s+)?$", re.I
)
_SENTENCES = re.compile(r"[.;!?\n]+")
_CLAUSES = re.compile(
    r",?\s*\b(?:and|while|whereas|but)\s+(?=(?:the|a|an|my|i|there|one|another)\b)"
    r"|,\s*(?=(?:the|a|an|my|i|there|one|another)\b)",
    re.IGNORECASE,
)


def relation(
    anchor: tuple[float, ...], pos: tuple[float, ...], tolerance: float
) -> tuple[str, str]:
    """(vertical, horizontal) of `pos` seen from `anchor`, as `core.spatial.grid_relation`,
    with differences within `tolerance` counting as the same row/column."""
    dr, dc = pos[0] - anchor[0], pos[1] - anchor[1]
    vertical = SAME_ROW if abs(dr) <= tolerance else (VERTICAL[0] if dr < 0 else VERTICAL[1])
    horizontal = (
        SAME_COLUMN if abs(dc) <= tolerance else (HORIZONTAL[0] if dc < 0 else HORIZONTAL[1])
    )
    return vertical, horizontal


def _flip(word: str | None) -> str | None:
    pairs = {VERTICAL[0]: VERTICAL[1], VERTICAL[1]: VERTICAL[0]}
    pairs |= {HORIZONTAL[0]: HORIZONTAL[1], HORIZONTAL[1]: HORIZONTAL[0]}
    return pairs.get(word, word) if word is not None else None


def _axis(clause: str, a: str, b: str, same: str) -> tuple[str | None, bool]:
    """The clause's word for one axis, and whether it said anything about it."""
    said = {w for w in (a, b, same) if _WORD_RE[w].search(clause)}
    if not said:
        return same, False  # not mentioned: the same row/column ("directly below")
    if len(said) > 1:
        return None, True  # contradicts itself
    return said.pop(), True


def parse_natural(text: str, object_types: Iterable[str], spec: GradingSpec) -> list[Relation]:
    """Relation claims in `text` about the given object types (and the anchor)."""
    names, mention, contained = _mention_pattern(tuple(object_types), spec.ignore)
    if contained is not None and text.isascii() and contained.search(text.lower()) is None:
        return []  # no name even inside a word (a grid, say): the regex can't find one
    if mention.search(text) is None:
        return []  # no object named anywhere: no clause can hold a claim
    ignored = _ignored_pattern(tuple(spec.ignore))
    claims: list[Relation] = []
    for sentence in _SENTENCES.split(text):
        for clause in _CLAUSES.split(sentence):
            if ignored is not None and ignored.search(clause):
                continue  # walls etc. are not graded
            subjects, refs = [], []
            for m in mention.finditer(clause):
                kind = m.lastgroup  # the one named alternative that matched
                obj = spec.anchor if kind == "anchor" else names[int(kind[1:])][0]
                (refs if _REF_BEFORE.search(clause[: m.start()]) else subjects).append(obj)
            if not subjects:
                continue  # no spatial claim here
            vertical, said_v = _axis(clause, VERTICAL[0], VERTICAL[1], SAME_ROW)
            horizontal, said_h = _axis(clause, HORIZONTAL[0], HORIZONTAL[1], SAME_COLUMN)
            if _WORD_RE["same"].search(clause):
                vertical, horizontal, said_v = SAME_ROW, SAME_COLUMN, True
            if not (said_v or said_h) or not subjects:
                continue  # no spatial claim here
            ref = refs[0] if refs else spec.anchor
            for subject in dict.fromkeys(subjects):
                if subject == ref:
                    continue
                if subject == spec.anchor:  # "I am above the box" -> the box is below me
                    claims.append(Relation(ref, spec.anchor, _flip(vertical), _flip(horizontal)))
                else:
                    claims.append(Relation(subject, ref, vertical, horizontal))
    return claims


@functools.lru_cache(maxsize=256)
def _mention_pattern(
    object_types: tuple[str, ...], ignore: tuple[str, ...]
) -> tuple[list[tuple[str, str]], re.Pattern[str], re.Pattern[str] | None]:
    """(type, name) pairs of the graded types, longest names first, the regex finding
    their mentions, and a plain search for the lowercased names anywhere (worked out once
    per set of types: every graded sentence asks).

    The plain search is a quick "none here" for ASCII text: a mention that the regex
    (word boundaries, any case) finds in ASCII text is one of these names in the
    lowercased text, so where they are all missing the regex finds nothing, ~0.5 us
    against ~3.5 for a 6x6 grid. None when a name is not ASCII (Unicode case folding
    matches more than `lower` does)."""
    types = sorted({t for t in object_types if t not in ignore and "." not in t}, key=len)
    names = [(t, t.replace("_", " ")) for t in reversed(types)]  # longest names first
    mention = re.compile(
        r"\b(?:"
        + "|".join(f"(?P<t{i}>{re.escape(n)}(?:e?s)?)" for i, (_, n) in enumerate(names))
        + (f"|(?P<anchor>{_ANCHOR_ALIASES})" if names else f"(?P<anchor>{_ANCHOR_ALIASES})")
        + r")\b",
        re.IGNORECASE,
    )
    words = [n.lower() for _, n in names] + _ANCHOR_ALIASES.split("|")
    contained = re.compile("|".join(map(re.escape, words))) if "".join(words).isascii() else None
    return names, mention, contained


@functools.lru_cache(maxsize=256)
def _ignored_pattern(ignore: tuple[str, ...]) -> re.Pattern[str] | None:
    if not ignore:
        return None
    return re.compile(
        r"\b(?:" + "|".join(re.escape(t.replace("_", " ")) for t in ignore) + r")s?\b", re.I
    )


def _relation_credit(claim: Relation, truth: tuple[str, str]) -> float:
    return 0.5 * (claim.vertical == truth[0]) + 0.5 * (claim.horizontal == truth[1])


def true_relations(truth: dict[str, Any], spec: GradingSpec) -> TrueRelations:
    """Positions per object type, relations to the anchor per type, and their count."""
    positions: dict[str, list[tuple[float, ...]]] = {}
    for item in state_items(truth, spec):
        if isinstance(item.value, tuple):
            positions.setdefault(item.key, []).append(item.value)
    if spec.anchor not in positions:
        raise ValueError(f"the truth has no position for the anchor {spec.anchor!r}")
    anchor = positions[spec.anchor][0]
    true_rel = {
        key: [relation(anchor, p, spec.tolerance) for p in ps]
        for key, ps in positions.items()
        if key != spec.anchor
    }
    n_truth = sum(len(v) for v in true_rel.values())
    return positions, true_rel, n_truth


def score_relations(
    claims: list[Relation],
    truth: dict[str, Any],
    spec: GradingSpec,
    known: TrueRelations | None = None,
) -> float:
    """F1 of relation claims against the true relations of every object to the anchor
    (`known`: `true_relations(truth, spec)`, worked out here when not handed in)."""
    positions, true_rel, n_truth = known if known is not None else true_relations(truth, spec)

    matched = 0.0
    anchored = [c for c in claims if c.ref == spec.anchor]
    for subject in {c.subject for c in anchored}:
        mine = [c for c in anchored if c.subject == subject]
        matched += matched_credit(mine, true_rel.get(subject, []), _relation_credit)
    pair_credit = 0.0
    for claim in claims:
        if claim.ref == spec.anchor:
            continue
        options = [
            relation(r, s, spec.tolerance)
            for s in positions.get(claim.subject, [])
            for r in positions.get(claim.ref, [])
        ]
        pair_credit += max((_relation_credit(claim, o) for o in options), default=0.0)

    if not claims:
        return 1.0 if n_truth == 0 else 0.0
    precision = (matched + pair_credit) / len(claims)
    recall = matched / n_truth if n_truth else 1.0
    return 0.0 if precision + recall == 0 else 2 * precision * recall / (precision + recall)


def natural_types(truth: dict[str, Any], spec: GradingSpec) -> set[str]:
    """The object types a natural description of `truth` may mention."""
    types = set(truth) | {t for ts in spec.symbols.values() for t in ts} | {spec.anchor}
    return {normalize_key(t) for t in types}


def grade_natural(
    text: str,
    truth: dict[str, Any],
    spec: GradingSpec,
    known: TrueRelations | None = None,
    types: Iterable[str] | None = None,
) -> float:
    """Score of the relation sentences in `text` against `truth` (see `score_relations`;
    `types`: `natural_types(truth, spec)`, worked out here when not handed in)."""
    if types is None:
        types = natural_types(truth, spec)
    return score_relations(parse_natural(text, types, spec), truth, spec, known)
