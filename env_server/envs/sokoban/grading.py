"""How Sokoban states are written as text and graded: VAGEN's grid symbols, the
GradingSpec that `reasoning/` reads them with, and the symbolic view that uses them."""

from __future__ import annotations

from env_server.core.spatial import GradingSpec

# text symbols (VAGEN's): one character per cell
WALL, FLOOR, TARGET, BOX = "#", "_", "O", "X"
BOX_ON_TARGET, PLAYER, PLAYER_ON_TARGET = "√", "P", "S"
SYMBOLS: dict[str, tuple[str, ...]] = {
    WALL: ("wall",),
    FLOOR: (),
    TARGET: ("target",),
    BOX: ("box",),
    BOX_ON_TARGET: ("box", "target"),
    PLAYER: ("player",),
    PLAYER_ON_TARGET: ("player", "target"),
}

GRADING = GradingSpec(anchor="player", symbols=SYMBOLS)


def symbolic(
    grid_size: list[int],
    walls: list[list[int]],
    player: list[int],
    boxes: list[list[int]],
    targets: list[list[int]],
) -> str:
    """The room as one row of symbols per line."""
    rows, cols = int(grid_size[0]), int(grid_size[1])
    grid = [[FLOOR] * cols for _ in range(rows)]
    for r, c in walls:
        grid[r][c] = WALL
    for r, c in targets:
        grid[r][c] = TARGET
    for r, c in boxes:
        grid[r][c] = BOX_ON_TARGET if grid[r][c] == TARGET else BOX
    r, c = player
    grid[r][c] = PLAYER_ON_TARGET if grid[r][c] == TARGET else PLAYER
    return "\n".join("".join(row) for row in grid)
