"""Grading an agent's description of a primitive_skill state (its `<observation>`/`<prediction>`).

`reasoning/` calls `PrimitiveSkillEnv.grade_description(text, truth, representation)` with
`truth = json.loads(describe(gt, STRUCTURED))`: "gripper" and each object name -> [x, y, z]
in millimetres (table frame). The generic grid readers of `reasoning/` cannot read these
states (sentences give coordinates, not relations; the grid has its own 50 mm layout), so
the environment grades them here.

Score = F1 between claimed and true positions, matched per name (Hungarian algorithm); a
matched pair earns 1 when every axis agrees and 0 otherwise. (Not a share of axes: z is
the table height for every resting cube and the gripper starts each episode at the same
point, so partial credit would reward the description of any other state.)

- structured: the first JSON object in the text, name -> [x, y, z] (or a list of them);
  an axis agrees within `tolerance` mm;
- natural: per sentence, the first object name it mentions and the first "(x, y, z)"
  triple in it ("The red cube is at (50, -120, 20) mm."); an axis agrees within
  `tolerance` mm. "holding ..." is not graded (the structured truth has no such key);
- symbolic: the longest block of grid lines written in the letters of `SYMBOLS` and '.',
  compared cell by cell with the true state's own grid (so objects hidden under another
  letter in the true grid are not asked for); an axis (row, column) agrees when equal.

`GRADING` is the environment's `GradingSpec` (positions in mm from the gripper, 30 mm
tolerance), `grid` writes a state in the symbolic representation and `state_prompt`
tells the agent how to write a state so that this grader reads it.
"""

from __future__ import annotations

import ast
import json
import math
import re
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
from scipy.optimize import linear_sum_assignment

from env_server.core import Environment, Representation, StatePrompt
from env_server.core.spatial import GradingSpec

Position = tuple[float, ...]

GRID_CELL_MM = 50  # the symbolic representation's top-down grid
SYMBOLS = {  # symbolic grid letters; '.' is an empty cell
    "gripper": "E",
    "red_cube": "R",
    "green_cube": "G",
    "purple_cube": "P",
    "left_target": "L",
    "right_target": "T",
    "apple": "A",
    "drawer": "D",
    "drawer_handle": "H",
}
LETTERS = {s: n for n, s in SYMBOLS.items()}
# world-model grading: positions in mm, matched within 30 mm; relations from the gripper
GRADING = GradingSpec(
    anchor="gripper",
    symbols={".": (), **{s: (n,) for n, s in SYMBOLS.items()}},
    tolerance=30.0,
    ignore=(),
)

_TRIPLE = re.compile(
    r"[(\[]\s*(-?\d+(?:\.\d+)?)\s*,\s*(-?\d+(?:\.\d+)?)\s*,\s*(-?\d+(?:\.\d+)?)\s*[)\]]"
)
_SENTENCE = re.compile(r"(?<!\d)\.(?!\d)|[;\n]")


def key(name: str) -> str:
    """'Red cube' / 'red-cube' -> 'red_cube'."""
    return re.sub(r"[\s_-]+", "_", name.strip().lower())


def _is_position(value: Any) -> bool:
    return (
        isinstance(value, list | tuple)
        and len(value) == 3
        and all(isinstance(v, int | float) and not isinstance(v, bool) for v in value)
    )


def positions(state: dict[str, Any]) -> dict[str, list[Position]]:
    """Name -> positions of a flat state dict (one [x, y, z] or a list of them)."""
    out: dict[str, list[Position]] = {}
    for name, value in state.items():
        if _is_position(value):
            out.setdefault(key(str(name)), []).append(tuple(float(v) for v in value))
        elif isinstance(value, list | tuple):
            found = [tuple(float(v) for v in p) for p in value if _is_position(p)]
            if found:
                out.setdefault(key(str(name)), []).extend(found)
    return out


def positions_only(state: dict[str, Any]) -> dict[str, Any]:
    """The entries of a flat state that are single [x, y, z] positions (the grid's input)."""
    return {name: value for name, value in state.items() if _is_position(value)}


# ---- readers ---------------------------------------------------------------------------


def parse_structured(text: str) -> dict[str, Any] | None:
    """The JSON object in `text` (lenient: code fences, (x, y, z) tuples, single quotes)."""
    start, end = text.find("{"), text.rfind("}")
    if start < 0 or end < start:
        return None
    body = text[start : end + 1]
    for candidate in (body, body.replace("(", "[").replace(")", "]")):
        for loads in (json.loads, ast.literal_eval):
            try:
                value = loads(candidate)
            except (ValueError, SyntaxError, TypeError, MemoryError, RecursionError):
                continue
            if isinstance(value, dict):
                return value
    return None


def parse_natural(text: str, names: Sequence[str]) -> dict[str, list[Position]]:
    """Per sentence: the first name mentioned and the first (x, y, z) triple."""
    spelled = sorted({n.replace("_", " ") for n in names}, key=len, reverse=True)
    if not spelled:
        return {}
    mention = re.compile(
        r"\b(" + "|".join(re.escape(n).replace(r"\ ", r"[\s_-]+") for n in spelled) + r")s?\b",
        re.IGNORECASE,
    )
    claims: dict[str, list[Position]] = {}
    for sentence in _SENTENCE.split(text):
        name, triple = mention.search(sentence), _TRIPLE.search(sentence)
        if name is None or triple is None:
            continue
        claims.setdefault(key(name.group(1)), []).append(tuple(float(v) for v in triple.groups()))
    return claims


def parse_grid(text: str, letters: dict[str, str]) -> dict[str, list[Position]]:
    """Name -> (row, column) cells read from the longest block of grid lines in `text`;
    `letters` maps a grid letter to its object name ('.' is an empty cell)."""
    allowed = set(letters) | {"."}
    best: list[str] = []
    run: list[str] = []
    for line in text.splitlines() + [""]:
        row = line.strip().strip("`").replace(" ", "")
        if row and set(row) <= allowed:
            run.append(row)
            continue
        if len(run) > len(best):
            best = run
        run = []
    out: dict[str, list[Position]] = {}
    for r, row in enumerate(best):
        for c, letter in enumerate(row):
            if letter in letters:
                out.setdefault(letters[letter], []).append((float(r), float(c)))
    return out


# ---- scoring ---------------------------------------------------------------------------


def within(tolerance: float) -> Callable[[Position, Position], float]:
    """1.0 when every axis of a claimed position is within `tolerance` of the true one."""

    def credit(claim: Position, truth: Position) -> float:
        if len(claim) != len(truth):
            return 0.0
        return float(all(abs(a - b) <= tolerance + 1e-9 for a, b in zip(claim, truth, strict=True)))

    return credit


def score(
    claims: dict[str, list[Position]],
    truth: dict[str, list[Position]],
    credit: Callable[[Position, Position], float],
) -> float:
    """F1 of claims against the truth, matched one-to-one per name (Hungarian algorithm)."""
    n_claims = sum(len(v) for v in claims.values())
    n_truth = sum(len(v) for v in truth.values())
    if n_claims == 0 and n_truth == 0:
        return 1.0
    total = 0.0
    for name, mine in claims.items():
        theirs = truth.get(name, [])
        if not theirs:
            continue
        matrix = np.array([[credit(c, t) for t in theirs] for c in mine])
        rows, cols = linear_sum_assignment(matrix, maximize=True)
        total += float(matrix[rows, cols].sum())
    return 2.0 * total / (n_claims + n_truth)


def grade(
    text: str,
    truth: dict[str, Any],
    representation: str,
    tolerance: float,
    true_grid: str,
    letters: dict[str, str],
) -> float:
    """Score in [0, 1] of `text` describing the state `truth` (structured, parsed).

    `true_grid` is the truth written in the symbolic representation, `letters` the grid's
    letter -> object name legend."""
    if representation == "symbolic":
        return score(parse_grid(text, letters), parse_grid(true_grid, letters), within(0))
    true = positions(truth)
    if representation == "structured":
        claimed = parse_structured(text)
        return score(positions(claimed) if claimed else {}, true, within(tolerance))
    names = set(true) | set(letters.values())
    return score(parse_natural(text, sorted(names)), true, within(tolerance))


# ---- the symbolic grid and the state prompt ---------------------------------------------


def grid(flat: dict[str, list[int]], workspace: Any) -> str:
    """Top-down grid, 50 mm cells: rows along x (row 0 nearest the robot), columns
    along y (column 0 at the lowest y); one letter per object, the later one wins."""
    (x0, x1), (y0, y1) = workspace[0], workspace[1]
    rows = max(1, math.ceil((x1 - x0) / GRID_CELL_MM))
    cols = max(1, math.ceil((y1 - y0) / GRID_CELL_MM))
    cells = [["."] * cols for _ in range(rows)]
    for name, p in flat.items():
        r = min(rows - 1, max(0, int((p[0] - x0) // GRID_CELL_MM)))
        c = min(cols - 1, max(0, int((p[1] - y0) // GRID_CELL_MM)))
        cells[r][c] = SYMBOLS.get(name, "?")
    return "\n".join("".join(row) for row in cells)


def state_prompt(
    env: Environment, representation: Representation, names: list[str], workspace_mm: Any
) -> StatePrompt:
    """How to write a state (mm positions, the 50 mm grid) of a task with the objects
    `names`, with a made-up example (before and after one pick) written by `env.describe`."""
    rep = Representation(representation)
    (x0, x1), (y0, y1), _ = workspace_mm
    objects = {n: [int(x0) + 125, int(y0) + 50 + 100 * i, 20] for i, n in enumerate(names)}
    before = {
        "gripper": [int(x0) + 25, int((y0 + y1) / 2), 150],
        "objects": objects,
        "holding": None,
        "workspace_mm": [[x0, x1], [y0, y1]],
    }
    first = names[0]
    x, y, z = objects[first]
    lifted = [x, y, 100]
    after = {**before, "gripper": lifted, "objects": {**objects, first: lifted}, "holding": first}
    where = "<observation> and <prediction> describe the state"
    spelled = ", ".join(names)
    if rep is Representation.STRUCTURED:
        instruction = (
            f'{where} as one JSON object mapping "gripper" and each object '
            f"({spelled}) to its [x, y, z] position in integer millimetres."
        )
        reminder = "as a JSON object of [x, y, z] positions in mm"
    elif rep is Representation.SYMBOLIC:
        legend = ", ".join(
            f"{s} {n.replace('_', ' ')}" for n, s in SYMBOLS.items() if n == "gripper" or n in names
        )
        instruction = (
            f"{where} as a top-down grid of {GRID_CELL_MM} mm cells over the workspace: one "
            f"line per {GRID_CELL_MM} mm of x (the first line nearest the robot, from x = "
            f"{x0:g}), one character per {GRID_CELL_MM} mm of y (the first from y = {y0:g}), "
            f"'.' for an empty cell and the letters: {legend}."
        )
        reminder = f"as a top-down grid of {GRID_CELL_MM} mm cells"
    else:
        instruction = (
            f"{where} in sentences giving the position of the gripper and of each object "
            "as (x, y, z) in millimetres, one sentence each, e.g. 'The gripper is at "
            "(0, 0, 150) mm, holding nothing.' and 'The red cube is at (50, -120, 20) mm.'; "
            f"a coordinate within {GRADING.tolerance:g} mm counts as right."
        )
        reminder = "as sentences with (x, y, z) positions in mm"
    return StatePrompt.written(
        env,
        rep,
        instruction=instruction,
        reminder=reminder,
        before=before,
        after=after,
        answer=f"pick({x}, {y}, {z})",
    )
