"""Sokoban: push every box onto a target in a small walled room.

Our own implementation (no gym-sokoban): seeded reverse-play level generation checked
by a BFS solver, VAGEN's reward constants and text symbols, and a tile renderer.
"""

from __future__ import annotations

import json
from typing import Annotated, Any, ClassVar

import numpy as np
from pydantic import Field, ValidationInfo, field_validator

from env_server.core import (
    Action,
    ActionKind,
    ActionSpace,
    EnvConfig,
    EnvError,
    Environment,
    Observation,
    Representation,
    ResponseFormat,
    Transition,
)
from env_server.core.spatial import GradingSpec, grid_relation, grid_sentence

from . import render
from .level import ACTIONS, Level, cells_rc, generate, move, solve

# how many candidate levels reset() draws before it gives up on the length bounds
GENERATION_TRIES = 200

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

RoomSide = Annotated[int, Field(ge=5, le=16)]


class SokobanConfig(EnvConfig):
    """Options of the Sokoban environment."""

    dim_room: tuple[RoomSide, RoomSide] = Field(
        (6, 6), description="Room size as [rows, cols], outer walls included."
    )
    num_boxes: int = Field(1, ge=1, le=4, description="Boxes (and targets) in the room.")
    min_solution_length: int = Field(
        3, ge=1, le=200, description="Fewest moves the shortest solution of a level may take."
    )
    max_solution_length: int = Field(
        20, ge=1, le=200, description="Most moves the shortest solution of a level may take."
    )
    tile_size: int = Field(16, ge=4, le=64, description="Pixels per cell side in the image.")
    max_actions_per_turn: int = Field(3, ge=1, le=20, description="Most moves one turn may hold.")
    step_reward: float = Field(-0.1, description="Reward of every executed move.")
    box_on_target_reward: float = Field(1.0, description="Reward for pushing a box onto a target.")
    box_off_target_reward: float = Field(-1.0, description="Reward for pushing a box off a target.")
    solved_reward: float = Field(10.0, description="Bonus when every box is on a target.")

    # field validators (not a model validator) so that the error's loc names a field;
    # each checks against fields declared before it, which pydantic has validated already
    @field_validator("num_boxes")
    @classmethod
    def _room_fits_boxes(cls, num_boxes: int, info: ValidationInfo) -> int:
        if "dim_room" in info.data:
            rows, cols = info.data["dim_room"]
            if (rows - 2) * (cols - 2) < 2 * num_boxes + 2:
                raise ValueError(f"dim_room {rows}x{cols} is too small for {num_boxes} boxes")
        return num_boxes

    @field_validator("max_solution_length")
    @classmethod
    def _bounds_in_order(cls, longest: int, info: ValidationInfo) -> int:
        shortest = info.data.get("min_solution_length")
        if shortest is not None and shortest > longest:
            raise ValueError(
                f"min_solution_length ({shortest}) must not exceed max_solution_length ({longest})"
            )
        return longest


class SokobanEnv(Environment):
    """Push every box onto a target; the player can push one box at a time, never pull."""

    name: ClassVar[str] = "sokoban"
    Config: ClassVar[type[EnvConfig]] = SokobanConfig
    description: ClassVar[str] = (
        "Sokoban in a small seeded room: push every box onto a target (Up/Down/Left/Right)."
    )
    grading: ClassVar[GradingSpec] = GradingSpec(anchor="player", symbols=SYMBOLS)

    config: SokobanConfig

    def __init__(self, config: SokobanConfig | None = None) -> None:
        super().__init__(config)
        self._action_space = ActionSpace(
            kind=ActionKind.DISCRETE,
            names=ACTIONS,
            max_per_turn=self.config.max_actions_per_turn,
            description="Up, Down, Left, Right: move one cell; walking into a box pushes it.",
        )
        self._level: Level | None = None
        self._background: np.ndarray | None = None  # tile index per cell: wall/floor/target
        self._static_gt: dict[str, Any] = {}
        self._turn = 0
        self._done = True
        self._plan: dict[tuple, list[str]] = {}  # state key -> the rest of a shortest solution

    @property
    def action_space(self) -> ActionSpace:
        return self._action_space

    # ---- episode --------------------------------------------------------
    def reset(self, seed: int) -> Observation:
        if isinstance(seed, bool) or not isinstance(seed, int | np.integer) or seed < 0:
            raise EnvError(f"seed must be a non-negative integer, got {seed!r}")
        seed = int(seed)
        cfg = self.config
        rows, cols = cfg.dim_room
        generated = generate(
            np.random.default_rng(seed),
            rows,
            cols,
            cfg.num_boxes,
            cfg.min_solution_length,
            cfg.max_solution_length,
            GENERATION_TRIES,
        )
        if generated is None:
            raise EnvError(
                f"no {rows}x{cols} level with {cfg.num_boxes} box(es) and a shortest solution of "
                f"{cfg.min_solution_length}..{cfg.max_solution_length} moves found in "
                f"{GENERATION_TRIES} tries for seed {seed}; widen the solution-length bounds",
                code="INVALID_ARGUMENT",
            )
        self._start(generated.level, generated.solution)
        return self._observation()

    def reset_from_text(self, text: str) -> Observation:
        """Start an episode on a given room, written as in the symbolic representation.

        For hand-made puzzles and tests; the room needs walls all around, one player and as
        many boxes as targets. The level is not required to be solvable (the oracle then
        returns no actions).
        """
        self._start(_parse(text), solution=None)
        return self._observation()

    def _start(self, level: Level, solution: list[str] | None) -> None:
        self._level = level
        background = np.full(level.height * level.width, render.FLOOR, dtype=np.intp)
        background[list(level.walls)] = render.WALL
        background[list(level.targets)] = render.TARGET
        self._background = background
        self._static_gt = {
            "grid_size": [level.height, level.width],
            "targets": cells_rc(level, level.targets),
            "walls": cells_rc(level, level.walls),
            "num_boxes": len(level.boxes),
        }
        self._turn = 0
        self._done = False
        self._plan = {}
        if solution is not None:
            self._remember_plan(level, solution)

    def step(self, actions: list[Action]) -> Transition:
        if self._level is None:
            raise EnvError("step() before reset(): reset the episode first", "FAILED_PRECONDITION")
        if self._done:
            raise EnvError(
                "the episode has ended (solved or out of turns); reset it to play again",
                code="FAILED_PRECONDITION",
            )
        cfg = self.config
        offsets = self._level.offsets()
        self._turn += 1
        reward, executed = 0.0, 0
        details: list[dict[str, Any]] = []
        invalid: list[str] = []
        skipped: list[str] = []
        for index, action in enumerate(actions):
            name = self._action_space.lookup(action.name)
            if index >= cfg.max_actions_per_turn:
                invalid.append(
                    f"{action.name}: over the limit of {cfg.max_actions_per_turn} actions per turn"
                )
                continue
            if name is None:
                invalid.append(f"{action.name}: unknown action; use one of {', '.join(ACTIONS)}")
                continue
            if self._level.solved:
                skipped.append(name)  # the episode ended earlier in this turn
                continue
            before = self._level.boxes_on_target
            outcome = move(self._level, name, offsets[name])
            self._level = outcome.level
            change = self._level.boxes_on_target - before
            r = cfg.step_reward
            if change > 0:
                r += cfg.box_on_target_reward
            elif change < 0:
                r += cfg.box_off_target_reward
            if self._level.solved:
                r += cfg.solved_reward
            reward += r
            executed += 1
            detail: dict[str, Any] = {"name": name, "result": outcome.result, "reward": round(r, 6)}
            if change:
                detail["box"] = "onto target" if change > 0 else "off target"
            details.append(detail)

        terminated = self._level.solved
        truncated = not terminated and self._turn >= cfg.max_turns
        self._done = terminated or truncated
        return Transition(
            observation=self._observation(),
            reward=reward,
            terminated=terminated,
            truncated=truncated,
            success=terminated,
            actions_executed=executed,
            invalid_actions=invalid,
            info={
                "actions": details,
                "skipped_actions": skipped,
                "boxes_on_target": self._level.boxes_on_target,
            },
        )

    def close(self) -> None:
        self._level = None
        self._done = True

    # ---- observation ----------------------------------------------------
    def render(self) -> np.ndarray:
        """The current frame: (rows * tile_size, cols * tile_size, 3) uint8."""
        level = self._require_level()
        cells = self._background.copy()
        for box in level.boxes:
            cells[box] = render.BOX_ON_TARGET if box in level.targets else render.BOX
        cells[level.player] = (
            render.PLAYER_ON_TARGET if level.player in level.targets else render.PLAYER
        )
        return render.compose(cells.reshape(level.height, level.width), self.config.tile_size)

    def _observation(self) -> Observation:
        return Observation(
            text="[Observation]: <image>",
            images=[self.render()],
            ground_truth=self.ground_truth(),
            info={"turn": self._turn, "max_turns": self.config.max_turns},
        )

    def ground_truth(self) -> dict[str, Any]:
        level = self._require_level()
        player = list(level.rc(level.player))
        boxes = cells_rc(level, level.boxes)
        relations = [
            _relation(kind, player, pos)
            for kind, positions in (("box", boxes), ("target", self._static_gt["targets"]))
            for pos in positions
        ]
        return {
            "grid_size": list(self._static_gt["grid_size"]),
            "player": player,
            "boxes": boxes,
            "targets": [list(p) for p in self._static_gt["targets"]],
            "walls": [list(p) for p in self._static_gt["walls"]],
            "num_boxes": self._static_gt["num_boxes"],
            "boxes_on_target": level.boxes_on_target,
            "relations": relations,
        }

    def describe(self, state: dict[str, Any], representation: Representation | str) -> str:
        try:
            representation = Representation(representation)
            player = [int(v) for v in state["player"]]
            boxes = [[int(v) for v in p] for p in state["boxes"]]
            targets = [[int(v) for v in p] for p in state["targets"]]
            if representation is Representation.STRUCTURED:
                return json.dumps({"player": player, "box": boxes, "target": targets})
            if representation is Representation.NATURAL:
                return " ".join(
                    [grid_sentence("box", "player", player, b) for b in boxes]
                    + [grid_sentence("target", "player", player, t) for t in targets]
                )
            return _symbolic(state["grid_size"], state["walls"], player, boxes, targets)
        except (KeyError, TypeError, ValueError, IndexError) as exc:
            raise EnvError(f"describe(): not a Sokoban ground-truth state ({exc!r})") from exc

    def system_prompt(self, format: ResponseFormat | str) -> str:
        n = self.config.max_actions_per_turn
        cfg = self.config
        return (
            "You are playing Sokoban. Push every box onto a target.\n"
            "Rules: you move one cell per action. Walking into a box pushes it one cell in the "
            "same direction if the cell behind it is free; you cannot pull boxes, push two boxes "
            "at once, or walk through walls. A box pushed into a corner can never be moved out again.\n"
            "The image shows the room from above: brown brick cells are walls, light grey cells "
            "are floor, a red ring marks a target, an orange crate with a cross is a box, a green "
            "crate is a box on a target, and the blue figure is you.\n"
            "As text, the room is written one row per line, one symbol per cell: "
            f"{WALL} wall, {FLOOR} floor, {TARGET} target, {BOX} box, {BOX_ON_TARGET} box on a "
            f"target, {PLAYER} you, {PLAYER_ON_TARGET} you on a target. Positions are "
            "[row, column], row 0 at the top, column 0 on the left.\n"
            f"Actions: {', '.join(ACTIONS)}. You may give up to {n} action(s) per turn, "
            f"separated by commas; they are executed in order.\n"
            f"Rewards: {cfg.step_reward:g} per move, {cfg.box_on_target_reward:+g} for a box "
            f"pushed onto a target, {cfg.box_off_target_reward:+g} for a box pushed off a target, "
            f"{cfg.solved_reward:+g} when all boxes are on targets."
        )

    # ---- oracle -----------------------------------------------------------
    def oracle_actions(self) -> list[Action]:
        """The next moves of a shortest solution ([] once solved, ended or deadlocked)."""
        level = self._require_level()
        if self._done:
            return []
        rest = self._plan.get(level.key())
        if rest is None:  # the agent left the planned path: plan again from here
            solution = solve(level)
            if solution is None:
                return []
            self._plan = {}
            self._remember_plan(level, solution)
            rest = solution
        return [Action(name) for name in rest[: self.config.max_actions_per_turn]]

    def _remember_plan(self, level: Level, solution: list[str]) -> None:
        offsets = level.offsets()
        for i, name in enumerate(solution):
            self._plan[level.key()] = solution[i:]
            level = move(level, name, offsets[name]).level

    def _require_level(self) -> Level:
        if self._level is None:
            raise EnvError("no episode: call reset() first", code="FAILED_PRECONDITION")
        return self._level


def _relation(kind: str, player: list[int], pos: list[int]) -> dict[str, Any]:
    vertical, horizontal = grid_relation(player, pos)
    return {"object": kind, "position": list(pos), "vertical": vertical, "horizontal": horizontal}


def _symbolic(
    grid_size: list[int],
    walls: list[list[int]],
    player: list[int],
    boxes: list[list[int]],
    targets: list[list[int]],
) -> str:
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


def _parse(text: str) -> Level:
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
