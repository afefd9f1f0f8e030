"""How FrozenLake states are written as text and graded: VAGEN's grid symbols, the
GradingSpec that `reasoning/` reads them with, and the symbolic view that uses them."""

from __future__ import annotations

from env_server.core.spatial import GradingSpec

# text symbols (VAGEN's): one character per cell
FROZEN, HOLE, GOAL, PLAYER, PLAYER_IN_HOLE, PLAYER_ON_GOAL = "_", "O", "G", "P", "X", "√"
SYMBOLS: dict[str, tuple[str, ...]] = {
    FROZEN: (),
    HOLE: ("hole",),
    GOAL: ("goal",),
    PLAYER: ("player",),
    PLAYER_IN_HOLE: ("player", "hole"),
    PLAYER_ON_GOAL: ("player", "goal"),
}

GRADING = GradingSpec(anchor="player", symbols=SYMBOLS)


def symbolic(
    grid_size: list[int], player: list[int], goal: list[int], holes: list[list[int]]
) -> str:
    """The lake as one row of symbols per line."""
    rows, cols = int(grid_size[0]), int(grid_size[1])
    grid = [[FROZEN] * cols for _ in range(rows)]
    for r, c in holes:
        grid[r][c] = HOLE
    grid[goal[0]][goal[1]] = GOAL
    r, c = player
    grid[r][c] = {HOLE: PLAYER_IN_HOLE, GOAL: PLAYER_ON_GOAL}.get(grid[r][c], PLAYER)
    return "\n".join("".join(row) for row in grid)
