"""FrozenLake's expert: a shortest safe path to the goal, by breadth-first search over
the map (also the check that makes every generated map solvable)."""

from __future__ import annotations

from collections import deque
from collections.abc import Mapping


def shortest_path(
    desc: tuple[str, ...], start: tuple[int, int], moves: Mapping[str, tuple[int, int]]
) -> list[str]:
    """The moves (names of `moves`, each a (row, column) step, tried in their order) of a
    shortest path from `start` to the goal "G" of the map `desc` that avoids the holes
    "H"; [] when there is none or `start` is the goal."""
    rows, cols = len(desc), len(desc[0])
    parent: dict[tuple[int, int], tuple[tuple[int, int], str]] = {}
    seen, frontier = {start}, deque([start])
    while frontier:
        cell = frontier.popleft()
        if desc[cell[0]][cell[1]] == "G":
            path: list[str] = []
            while cell != start:
                cell, name = parent[cell]
                path.append(name)
            return path[::-1]
        for name, (dr, dc) in moves.items():
            nxt = (cell[0] + dr, cell[1] + dc)
            if not (0 <= nxt[0] < rows and 0 <= nxt[1] < cols) or nxt in seen:
                continue
            if desc[nxt[0]][nxt[1]] == "H":
                continue
            seen.add(nxt)
            parent[nxt] = (cell, name)
            frontier.append(nxt)
    return []
