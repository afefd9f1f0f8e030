"""Sokoban rules, seeded level generation by reverse play, and a BFS solver.

Cells are flat indices `row * width + col`; the outer ring of every room is wall, so a
move by one of the `offsets` never leaves the grid.

Generation (our own take on the classic reverse-play method):

1. carve a connected room topology with a random walk inside the outer walls;
2. put the targets and the player on random floor cells, every box on a target;
3. play backwards: the player walks at random and, when a box is right behind it,
   usually pulls the box along (the reverse of a push), which scatters the boxes
   along paths the player can push them back on;
4. measure the true shortest solution with a forward BFS and keep the level when its
   length is within the requested bounds, otherwise draw again from the same RNG.

`parse` reads a hand-made room written in the symbolic representation.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass
from typing import NamedTuple

import numpy as np

from env_server.core import EnvError

from .grading import SYMBOLS, WALL

ACTIONS: tuple[str, ...] = ("Up", "Down", "Left", "Right")
DELTAS: dict[str, tuple[int, int]] = {
    "Up": (-1, 0),
    "Down": (1, 0),
    "Left": (0, -1),
    "Right": (0, 1),
}

# the chance that the reverse player pulls a box that is right behind it
PULL_PROBABILITY = 0.8
# BFS gives up after this many states (a level that large is too hard to verify)
MAX_SEARCH_STATES = 300_000


@dataclass(frozen=True)
class Level:
    """One Sokoban position: a fixed room plus the movable player and boxes."""

    height: int
    width: int
    walls: frozenset[int]
    targets: frozenset[int]
    boxes: frozenset[int]
    player: int

    def offsets(self) -> dict[str, int]:
        return {name: dr * self.width + dc for name, (dr, dc) in DELTAS.items()}

    def rc(self, cell: int) -> tuple[int, int]:
        return divmod(cell, self.width)

    @property
    def solved(self) -> bool:
        return self.boxes == self.targets

    @property
    def boxes_on_target(self) -> int:
        return len(self.boxes & self.targets)

    def key(self) -> tuple[int, frozenset[int]]:
        return self.player, self.boxes

    def moved(self, player: int, boxes: frozenset[int] | None = None) -> Level:
        """The same room with the player (and boxes) elsewhere."""
        boxes = self.boxes if boxes is None else boxes
        return Level(self.height, self.width, self.walls, self.targets, boxes, player)


class MoveResult(NamedTuple):
    """What one move did (a named tuple: a frozen dataclass took ~1 us to make, twice a
    step)."""

    level: Level
    result: str  # "moved", "pushed" or "blocked"
    box_from: int | None = None  # for a push: where the box was
    box_to: int | None = None  # and where it went


def move(level: Level, action: str, offset: int) -> MoveResult:
    """Apply one move. Blocked moves (wall, or a box that can't go further) change nothing."""
    dest = level.player + offset
    if dest in level.walls:
        return MoveResult(level, "blocked")
    if dest in level.boxes:
        beyond = dest + offset
        if beyond in level.walls or beyond in level.boxes:
            return MoveResult(level, "blocked")
        boxes = (level.boxes - {dest}) | {beyond}
        return MoveResult(level.moved(dest, boxes), "pushed", dest, beyond)
    return MoveResult(level.moved(dest), "moved")


def solve(level: Level, max_length: int | None = None) -> list[str] | None:
    """A shortest move sequence that puts every box on a target (BFS over player + boxes).

    None when there is no solution (a deadlock), none within `max_length` moves, or the
    search exceeds MAX_SEARCH_STATES.
    """
    if level.solved:
        return []
    offsets = level.offsets()
    walls, targets = level.walls, level.targets
    start = level.key()
    parent: dict[tuple[int, frozenset[int]], tuple[tuple[int, frozenset[int]], str]] = {}
    seen = {start}
    frontier = deque([(start, 0)])
    while frontier:
        (player, boxes), depth = frontier.popleft()
        if max_length is not None and depth >= max_length:
            continue
        for name in ACTIONS:
            off = offsets[name]
            dest = player + off
            if dest in walls:
                continue
            if dest in boxes:
                beyond = dest + off
                if beyond in walls or beyond in boxes:
                    continue
                new_boxes = (boxes - {dest}) | {beyond}
            else:
                new_boxes = boxes
            state = (dest, new_boxes)
            if state in seen:
                continue
            seen.add(state)
            parent[state] = ((player, boxes), name)
            if new_boxes == targets:
                return _path(parent, start, state)
            if len(seen) > MAX_SEARCH_STATES:
                return None
            frontier.append((state, depth + 1))
    return None


def _path(parent: dict, start: tuple, end: tuple) -> list[str]:
    actions: list[str] = []
    state = end
    while state != start:
        state, name = parent[state]
        actions.append(name)
    return actions[::-1]


# ---- generation ----------------------------------------------------------------


class _Draws:
    """numpy's draws on `default_rng`'s bit generator (PCG64), made here from its raw
    64-bit outputs: the very values `rng.random()`, `rng.integers(...)`, `rng.uniform(...)`
    and `rng.choice(..., replace=False)` would give, without numpy's per-call overhead (a
    level takes ~300 draws, and numpy's calls and the arrays around them were most of
    generation's time).

    How numpy makes them (numpy/random/_generator.pyx and distributions.c): PCG64's 32-bit
    outputs are the two halves of a 64-bit one, the low half first, the high half kept in
    the generator's state (`has_uint32`, `uinteger`) for the next 32-bit draw. `random()`
    is the next 64-bit output's top 53 bits times 2**-53 and leaves a kept half alone;
    `uniform(a, b)` is `a + (b - a) * random()`. `integers(lo, hi)` with a range below
    2**32 is Lemire's method on 32-bit draws, with its rejection. `choice(n, k,
    replace=False)` is Floyd's algorithm over those bounded draws, then a Fisher-Yates
    shuffle of the k picks by the same draws. The outputs are taken in chunks
    (`random_raw`); `close` leaves the generator exactly where numpy's draws would have.
    Given a seed instead of a generator, the draws are `default_rng(seed)`'s, from a
    generator no one else holds: nothing to read first or to put back (~10 us a level).
    """

    CHUNK = 128

    __slots__ = ("_bits", "_start", "_chunk", "_next", "_used", "_has", "_kept")

    def __init__(self, rng: np.random.Generator | int) -> None:
        if not isinstance(rng, np.random.Generator):
            self._bits, self._start = np.random.PCG64(rng), None
            self._has, self._kept = 0, 0
        else:
            bits = rng.bit_generator
            if type(bits) is not np.random.PCG64:
                raise TypeError(f"level generation draws from PCG64 (default_rng), not {bits!r}")
            self._bits = bits
            self._start = bits.state
            self._has, self._kept = self._start["has_uint32"], self._start["uinteger"]
        self._chunk: list[int] = []
        self._next = 0  # in the chunk
        self._used = 0  # 64-bit outputs taken before the chunk

    def _refill(self) -> None:
        self._used += len(self._chunk)
        self._chunk = self._bits.random_raw(self.CHUNK).tolist()
        self._next = 0

    def _uint32(self) -> int:
        if self._has:
            self._has = 0
            return self._kept
        if self._next == len(self._chunk):
            self._refill()
        out = self._chunk[self._next]
        self._next += 1
        self._has, self._kept = 1, out >> 32
        return out & 0xFFFFFFFF

    def random(self) -> float:
        """`rng.random()`."""
        if self._next == len(self._chunk):
            self._refill()
        out = self._chunk[self._next]
        self._next += 1
        return (out >> 11) * (1.0 / 9007199254740992.0)

    def quarter(self) -> int:
        """`int(rng.integers(4))`: the top two bits of a 32-bit draw (never rejected)."""
        return self._uint32() >> 30

    def below(self, n: int) -> int:
        """`int(rng.integers(n))` for 0 < n <= 2**32: Lemire's method, with rejection."""
        if n == 1:
            return 0  # numpy draws nothing for a range of one value
        m = self._uint32() * n
        if (m & 0xFFFFFFFF) < n:
            threshold = (0x100000000 - n) % n
            while (m & 0xFFFFFFFF) < threshold:
                m = self._uint32() * n
        return m >> 32

    def integers(self, low: int, high: int) -> int:
        """`int(rng.integers(low, high))`."""
        return low + self.below(high - low)

    def uniform(self, low: float, high: float) -> float:
        """`rng.uniform(low, high)`."""
        return low + (high - low) * self.random()

    def sample(self, n: int, k: int) -> list[int]:
        """`rng.choice(n, size=k, replace=False).tolist()` (n up to 10,000)."""
        picked: list[int] = []
        for j in range(n - k, n):  # Floyd's algorithm
            value = self.below(j + 1)
            picked.append(j if value in picked else value)
        for i in range(k - 1, 0, -1):  # then numpy shuffles the picks
            j = self.below(i + 1)
            picked[i], picked[j] = picked[j], picked[i]
        return picked

    def close(self) -> None:
        """Put the generator where numpy's own draws would have left it."""
        if self._start is None:
            return  # made from a seed here: no one else draws from it
        bits = self._bits
        bits.state = self._start  # back to the start, then exactly the outputs used
        used = self._used + self._next
        if used:
            bits.random_raw(used)
        state = bits.state
        state["has_uint32"], state["uinteger"] = self._has, self._kept
        bits.state = state


def _carve_room(draws: _Draws, height: int, width: int, min_floor: int) -> set[int]:
    """A connected floor area (its cells) carved by a random walk inside the outer walls."""
    interior = (height - 2) * (width - 2)
    wanted = max(min_floor, round(draws.uniform(0.55, 0.8) * interior))
    wanted = min(wanted, interior)
    cell = draws.integers(1, height - 1) * width + draws.integers(1, width - 1)
    inside = {r * width + c for r in range(1, height - 1) for c in range(1, width - 1)}
    offsets = (-width, width, -1, 1)  # Up, Down, Left, Right
    random, quarter = draws.random, draws.quarter
    direction = quarter()
    carved = set()
    for _ in range(50 * interior):
        carved.add(cell)
        if len(carved) >= wanted:
            break
        if random() < 0.35:
            direction = quarter()
        step = cell + offsets[direction]
        if step in inside:  # the walk stays inside the outer walls
            cell = step
        else:
            direction = quarter()
    return carved


def _reverse_play(draws: _Draws, level: Level, steps: int) -> Level:
    """Walk the player backwards for `steps` moves, pulling boxes now and then.

    Returns the visited position whose boxes are farthest (Manhattan distance to the
    nearest target, summed) from the targets: the one that is likely hardest to solve.
    """
    offsets = tuple(level.offsets().values())
    walls, w = level.walls, level.width
    targets = [divmod(t, w) for t in level.targets]
    far: dict[int, int] = {}  # a cell's distance to the nearest target, as met
    player, boxes = level.player, set(level.boxes)
    best, best_score = (player, level.boxes), 0
    random, quarter = draws.random, draws.quarter
    for _ in range(steps):
        off = offsets[quarter()]
        dest = player + off
        if dest in walls or dest in boxes:
            continue
        behind = player - off
        pulled = behind in boxes and random() < PULL_PROBABILITY
        if pulled:
            boxes.remove(behind)
            boxes.add(player)
        player = dest
        if pulled:
            score = 0
            for box in boxes:
                if box not in far:
                    r, c = divmod(box, w)
                    far[box] = min(abs(r - tr) + abs(c - tc) for tr, tc in targets)
                score += far[box]
            if score > best_score:
                best, best_score = (player, frozenset(boxes)), score
    # walking (without pulling) is reversible, so any cell the player can reach from there
    # keeps the level solvable
    found = level.moved(*best)
    reachable = sorted(_reachable(found))
    return found.moved(reachable[draws.below(len(reachable))])


def _reachable(level: Level) -> set[int]:
    """Cells the player can walk to without moving a box."""
    offsets = level.offsets().values()
    seen, todo = {level.player}, [level.player]
    while todo:
        cell = todo.pop()
        for off in offsets:
            nxt = cell + off
            if nxt not in seen and nxt not in level.walls and nxt not in level.boxes:
                seen.add(nxt)
                todo.append(nxt)
    return seen


def _candidate(draws: _Draws, height: int, width: int, num_boxes: int) -> Level | None:
    """One random level (not yet checked against solution-length bounds), or None."""
    floor = _carve_room(draws, height, width, min_floor=2 * num_boxes + 2)
    if len(floor) < num_boxes + 2:
        return None
    cells = sorted(floor)
    chosen = [cells[i] for i in draws.sample(len(cells), num_boxes + 1)]
    targets = frozenset(chosen[:num_boxes])
    walls = frozenset(range(height * width)).difference(floor)
    start = Level(height, width, walls, targets, boxes=targets, player=chosen[-1])
    steps = draws.integers(3 * (height + width), 8 * (height + width))
    level = _reverse_play(draws, start, steps)
    return None if level.solved else level


@dataclass(frozen=True)
class Generated:
    level: Level
    solution: list[str]
    tries: int


def generate(
    rng: np.random.Generator | int,
    height: int,
    width: int,
    num_boxes: int,
    min_length: int,
    max_length: int,
    max_tries: int,
) -> Generated | None:
    """The first candidate whose shortest solution has min_length..max_length moves.

    `rng` is a `default_rng` (PCG64), left as numpy's own draws would leave it, or the
    seed of one (the same level, without a generator to hand back)."""
    draws = _Draws(rng)
    try:
        for tries in range(1, max_tries + 1):
            level = _candidate(draws, height, width, num_boxes)
            if level is None:
                continue
            solution = solve(level, max_length=max_length)
            if solution is not None and len(solution) >= min_length:
                return Generated(level, solution, tries)
        return None
    finally:
        draws.close()


def cells_rc(level: Level, cells: Iterable[int]) -> list[list[int]]:
    """Flat cells as sorted [row, col] lists (JSON-friendly)."""
    width = level.width
    return [[c // width, c % width] for c in sorted(cells)]


def parse(text: str) -> Level:
    """A room written as in the symbolic representation (see `grading.py`), for hand-made
    puzzles: walls all around, one player and as many boxes as targets (not solved yet).
    EnvError names what is wrong."""
    lines = [line for line in text.strip("\n").splitlines() if line.strip()]
    rows, cols = len(lines), len(lines[0]) if lines else 0
    if rows < 3 or any(len(line) != cols for line in lines) or cols < 3:
        raise EnvError("a Sokoban room must be a rectangle of at least 3x3 symbols")
    walls, targets, boxes, players = set(), set(), set(), []
    for r, line in enumerate(lines):
        for c, symbol in enumerate(line):
            if symbol not in SYMBOLS:
                raise EnvError(f"unknown symbol {symbol!r} at [{r}, {c}]; use {''.join(SYMBOLS)}")
            kinds, cell = SYMBOLS[symbol], r * cols + c
            border = r in (0, rows - 1) or c in (0, cols - 1)
            if border and kinds != ("wall",):
                raise EnvError(
                    f"the room must be walled in: [{r}, {c}] is {symbol!r}, not {WALL!r}"
                )
            if "wall" in kinds:
                walls.add(cell)
            if "target" in kinds:
                targets.add(cell)
            if "box" in kinds:
                boxes.add(cell)
            if "player" in kinds:
                players.append(cell)
    if len(players) != 1:
        raise EnvError(f"a Sokoban room needs exactly one player, found {len(players)}")
    if not boxes or len(boxes) != len(targets):
        raise EnvError(
            f"a Sokoban room needs as many boxes as targets (>0), found "
            f"{len(boxes)} and {len(targets)}"
        )
    level = Level(rows, cols, frozenset(walls), frozenset(targets), frozenset(boxes), players[0])
    if level.solved:
        raise EnvError("every box is already on a target")
    return level
