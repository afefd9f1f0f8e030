"""ActionSpace.lookup: the spelling tables made once read names as the per-call walk did."""

from __future__ import annotations

import pytest

from env_server.core.types import ActionKind, ActionSpace
from env_server.envs.navigation.env import VAGEN_MAIN_NAMES


def walk(space: ActionSpace, name: str, vagen: bool) -> str | None:
    """The lookup as it was written before the tables: every spelling tried in order."""
    wanted = name.strip().lower()
    spellings = [(n, n) for n in space.names] if not (vagen and space.vagen_names) else []
    spellings += list(space.vagen_names.items())
    return next((c for s, c in spellings if s.lower() == wanted), None)


SPACES = [
    ActionSpace(ActionKind.DISCRETE, ("Up", "Down", "Left", "Right"), 3),
    ActionSpace(
        ActionKind.DISCRETE,
        tuple(VAGEN_MAIN_NAMES.values()),
        3,
        vagen_names=dict(VAGEN_MAIN_NAMES),
    ),
    # a VAGEN spelling equal to one of our names (other case): the first spelling wins
    ActionSpace(ActionKind.DISCRETE, ("Jump", "Duck"), 1, vagen_names={"duck": "Jump"}),
]
NAMES = ["Up", "up", "  UP ", "right", "Rightt", "", "moveahead", "MoveAhead", "move_forward",
         " Move_Left", "lookup", "look_up", "jump", "DUCK", "duck", "Duck", "unknown"]  # fmt: skip


@pytest.mark.parametrize("space", SPACES)
@pytest.mark.parametrize("vagen", [False, True])
def test_lookup_reads_every_spelling_as_the_walk_did(space, vagen):
    for name in NAMES:
        assert space.lookup(name, vagen) == walk(space, name, vagen), (name, vagen)
    assert SPACES[0].lookup("dOwN") == "Down" and SPACES[0].lookup("north") is None
