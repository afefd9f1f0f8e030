"""Sokoban's expert: the moves of a shortest solution (BFS, `level.solve`), remembered
per position so that the search runs again only when the agent leaves the planned path."""

from __future__ import annotations

from .level import Level, move, solve


class Planner:
    """The rest of a shortest solution for every position on the planned path."""

    def __init__(self) -> None:
        self.plan: dict[tuple, list[str]] = {}  # state key -> the rest of a shortest solution
        self._known: tuple[Level, list[str]] | None = None  # a solution not laid out yet

    def start(self, level: Level, solution: list[str] | None) -> None:
        """A new episode on `level`, with its shortest solution when it is known. The
        solution is laid out along its path when a move is first asked for (~10 us a
        level, and most episodes never ask: an agent plays them)."""
        self.plan = {}
        self._known = None if solution is None else (level, solution)

    def next_moves(self, level: Level) -> list[str]:
        """The rest of a shortest solution from `level` ([] once solved or deadlocked)."""
        if self._known is not None:
            self._remember(*self._known)
            self._known = None
        rest = self.plan.get(level.key())
        if rest is None:  # the agent left the planned path: plan again from here
            solution = solve(level)
            if solution is None:
                return []
            self.start(level, solution)
            rest = solution
        return rest

    def _remember(self, level: Level, solution: list[str]) -> None:
        offsets = level.offsets()
        for i, name in enumerate(solution):
            self.plan[level.key()] = solution[i:]
            level = move(level, name, offsets[name]).level
