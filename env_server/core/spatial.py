"""Shared vocabulary for writing and grading states.

Environments use these helpers to write their `natural` representation, and
`core.reading` reads the same words back (for `reasoning/` when it grades an agent's
description), so both sides agree on what "above and to the left of the player" means.

Conventions for grid environments: positions are `[row, col]`, row 0 at the top,
col 0 on the left. For continuous environments positions are `[x, y, z]` in the
environment's unit (mm for primitive_skill, metres for navigation).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

# the words for the two axes of a grid relation, in the order they are written
VERTICAL = ("above", "below")
HORIZONTAL = ("left", "right")
SAME_ROW = "same row"
SAME_COLUMN = "same column"


@dataclass(frozen=True)
class GradingSpec:
    """What `reasoning/` needs to grade descriptions of an environment's state.

    The truth that is graded is `json.loads(env.describe(state, STRUCTURED))`: a flat
    dict mapping an object type to one position or a list of positions.

    - `anchor`: the object that natural-language relations are relative to.
    - `symbols`: for the symbolic representation, each grid symbol and the object
      types standing on that cell (e.g. "S": ("player", "target")).
    - `tolerance`: how far a claimed continuous position may be from the truth and
      still count as matched (0 for grids: cells must be equal).
    - `ignore`: object types that are not graded (e.g. walls).
    """

    anchor: str = "player"
    symbols: dict[str, tuple[str, ...]] = field(default_factory=dict)
    tolerance: float = 0.0
    ignore: tuple[str, ...] = ("wall",)


def grid_relation(anchor: Sequence[int], pos: Sequence[int]) -> tuple[str, str]:
    """(vertical, horizontal) words for `pos` as seen from `anchor` on a grid."""
    dr, dc = pos[0] - anchor[0], pos[1] - anchor[1]
    vertical = SAME_ROW if dr == 0 else (VERTICAL[0] if dr < 0 else VERTICAL[1])
    horizontal = SAME_COLUMN if dc == 0 else (HORIZONTAL[0] if dc < 0 else HORIZONTAL[1])
    return vertical, horizontal


def relation_phrase(vertical: str, horizontal: str) -> str:
    """'above and to the left of', 'directly below', 'in the same row, to the right of'."""
    if vertical == SAME_ROW and horizontal == SAME_COLUMN:
        return "at the same position as"
    if vertical == SAME_ROW:
        return f"in the same row, to the {horizontal} of"
    if horizontal == SAME_COLUMN:
        return f"in the same column, {vertical}"
    return f"{vertical} and to the {horizontal} of"


def grid_sentence(obj: str, anchor_name: str, anchor: Sequence[int], pos: Sequence[int]) -> str:
    """One sentence: 'The box is below and to the right of the player.'"""
    return f"The {obj} is {relation_phrase(*grid_relation(anchor, pos))} the {anchor_name}."
