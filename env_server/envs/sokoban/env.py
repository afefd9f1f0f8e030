"""Sokoban: push every box onto a target in a small walled room.

Our own implementation (no gym-sokoban): seeded reverse-play level generation checked
by a BFS solver (`level.py`), VAGEN's reward constants and text symbols (`grading.py`),
the BFS oracle (`oracle.py`) and a tile renderer (`render.py`).
"""

from __future__ import annotations

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
from env_server.core.env import Reward, no_episode, unknown_action
from env_server.core.spatial import GradingSpec, grid_relation, grid_sentence

from . import render
from .grading import (
    BOX,
    BOX_ON_TARGET,
    FLOOR,
    GRADING,
    PLAYER,
    PLAYER_ON_TARGET,
    TARGET,
    WALL,
    symbolic,
)
from .level import ACTIONS, Level, cells_rc, generate, move, parse
from .oracle import Planner

# how many candidate levels reset() draws before it gives up on the length bounds
GENERATION_TRIES = 200

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
    step_reward: Reward = Field(-0.1, description="Reward of every executed move.")
    box_on_target_reward: Reward = Field(1.0, description="Reward for pushing a box onto a target.")
    box_off_target_reward: Reward = Field(
        -1.0, description="Reward for pushing a box off a target."
    )
    solved_reward: Reward = Field(10.0, description="Bonus when every box is on a target.")

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
    grading: ClassVar[GradingSpec] = GRADING
    # the episode's unchanging part of the ground truth (`_static_gt`, never changed in place)
    fixed_ground_truth: ClassVar[frozenset[str]] = frozenset(
        {"grid_size", "targets", "walls", "num_boxes"}
    )

    config: SokobanConfig

    def __init__(self, config: SokobanConfig | None = None) -> None:
        super().__init__(config)
        self._level: Level | None = None
        self._background: np.ndarray | None = None  # the frame of the walls, floor, targets
        self._static_gt: dict[str, Any] = {}
        self._planner = Planner()
        self._given: Level | None = None  # the room reset_from_text is starting

    @classmethod
    def action_space_for(cls, config: SokobanConfig) -> ActionSpace:
        return ActionSpace(
            kind=ActionKind.DISCRETE,
            names=ACTIONS,
            max_per_turn=config.max_actions_per_turn,
            description="Up, Down, Left, Right: move one cell; walking into a box pushes it.",
        )

    # ---- episode --------------------------------------------------------
    def _reset(self, seed: int) -> Observation:
        if self._given is not None:
            self._start(self._given, solution=None)
            return self._observation()
        cfg = self.config
        rows, cols = cfg.dim_room
        generated = generate(
            seed,  # default_rng(seed)'s draws
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
        returns no actions). The episode starts as `reset` starts one (turn count and all),
        on this room instead of a generated one.
        """
        self._given = parse(text)
        try:
            return self.reset(0)
        finally:
            self._given = None

    def _start(self, level: Level, solution: list[str] | None) -> None:
        self._level = level
        self._background = render.background(level, self.config.tile_size)
        self._static_gt = {
            "grid_size": [level.height, level.width],
            "targets": cells_rc(level, level.targets),
            "walls": cells_rc(level, level.walls),
            "num_boxes": len(level.boxes),
        }
        self._planner.start(level, solution)

    def _apply(self, actions: list[Action]) -> Transition:
        cfg = self.config
        level = self._require_level()
        offsets = level.offsets()
        reward, executed = 0.0, 0
        details: list[dict[str, Any]] = []
        invalid: list[str] = []
        skipped: list[str] = []
        for action in actions:
            name = self.action_space.lookup(action.name)
            if name is None:
                invalid.append(unknown_action(action, self.action_space))
                continue
            if level.solved:
                skipped.append(name)  # the episode ended earlier in this turn
                continue
            before = level.boxes_on_target
            outcome = move(level, name, offsets[name])
            level = outcome.level
            change = level.boxes_on_target - before
            r = cfg.step_reward
            if change > 0:
                r += cfg.box_on_target_reward
            elif change < 0:
                r += cfg.box_off_target_reward
            if level.solved:
                r += cfg.solved_reward
            reward += r
            executed += 1
            detail: dict[str, Any] = {"name": name, "result": outcome.result, "reward": round(r, 6)}
            if change:
                detail["box"] = "onto target" if change > 0 else "off target"
            details.append(detail)
        self._level = level
        return Transition(
            observation=self._observation(),
            reward=reward,
            terminated=level.solved,
            truncated=False,
            success=level.solved,
            actions_executed=executed,
            invalid_actions=invalid,
            info={
                "actions": details,
                "skipped_actions": skipped,
                "boxes_on_target": level.boxes_on_target,
            },
        )

    def close(self) -> None:
        self._level = None

    # ---- observation ----------------------------------------------------
    def render(self) -> np.ndarray:
        """The current frame: (rows * tile_size, cols * tile_size, 3) uint8."""
        level = self._require_level()
        assert self._background is not None
        return render.frame(level, self._background, self.config.tile_size)

    def _observation(self) -> Observation:
        return Observation(
            text="[Observation]: <image>",
            images=[self.render()],
            ground_truth=self.ground_truth(),
            info={"turn": self.turn, "max_turns": self.config.max_turns},
        )

    def ground_truth(self) -> dict[str, Any]:
        """The true state. What never changes in an episode (`grid_size`, `targets`,
        `walls`: ~30 small lists) is the same list objects in every ground truth of the
        episode, not a copy per step (the copies and the garbage collections they set off
        were ~10% of a step); like every observation, treat it as read-only."""
        level = self._require_level()
        static = self._static_gt
        player = list(level.rc(level.player))
        boxes = cells_rc(level, level.boxes)
        relations = [
            _relation(kind, player, pos)
            for kind, positions in (("box", boxes), ("target", static["targets"]))
            for pos in positions
        ]
        return {
            "grid_size": static["grid_size"],
            "player": player,
            "boxes": boxes,
            "targets": static["targets"],
            "walls": static["walls"],
            "num_boxes": static["num_boxes"],
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
                # json.dumps({"player": player, "box": boxes, "target": targets}): a list
                # of ints prints as JSON writes it, in a third of json.dumps's time
                return f'{{"player": {player}, "box": {boxes}, "target": {targets}}}'
            if representation is Representation.NATURAL:
                return " ".join(
                    [grid_sentence("box", "player", player, b) for b in boxes]
                    + [grid_sentence("target", "player", player, t) for t in targets]
                )
            return symbolic(state["grid_size"], state["walls"], player, boxes, targets)
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
    def _oracle(self) -> list[Action]:
        """The next moves of a shortest solution ([] once deadlocked)."""
        return [Action(name) for name in self._planner.next_moves(self._require_level())]

    def _require_level(self) -> Level:
        if self._level is None:
            raise no_episode()
        return self._level


def _relation(kind: str, player: list[int], pos: list[int]) -> dict[str, Any]:
    vertical, horizontal = grid_relation(player, pos)
    return {"object": kind, "position": list(pos), "vertical": vertical, "horizontal": horizontal}
