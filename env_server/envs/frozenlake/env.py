"""FrozenLake: walk across the ice to the goal without falling into a hole.

Runs on gymnasium's `FrozenLake-v1` (not slippery) for the rules and the pictures
(`render.py`). The map is drawn from the seed at every reset (`generate_map`): holes,
and a start and a goal at random cells (as VAGEN does), redrawn until a safe path joins
them (the oracle's search, `oracle.py`), so a policy has to read the map (gymnasium's
generator always starts at the top-left and ends at the bottom-right, where one blind
plan solves a third of the levels). Text symbols and grading: `grading.py`.
"""

from __future__ import annotations

import copy
import json
from typing import Any, ClassVar, Literal

import numpy as np
from gymnasium.envs.toy_text.frozen_lake import FrozenLakeEnv as GymFrozenLake
from pydantic import Field

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
    FROZEN,
    GOAL,
    GRADING,
    HOLE,
    PLAYER,
    PLAYER_IN_HOLE,
    PLAYER_ON_GOAL,
    symbolic,
)
from .oracle import shortest_path

# canonical names in gymnasium's action order (0 Left, 1 Down, 2 Right, 3 Up)
ACTIONS: tuple[str, ...] = ("Left", "Down", "Right", "Up")
DELTAS: dict[str, tuple[int, int]] = {
    "Left": (0, -1),
    "Down": (1, 0),
    "Right": (0, 1),
    "Up": (-1, 0),
}

TEXT_AS = {
    "symbolic": "a grid of symbols",
    "natural": "one sentence per object, saying where it is from you",
    "structured": "JSON of [row, column] positions",
}


class FrozenLakeConfig(EnvConfig):
    """Options of the FrozenLake environment."""

    size: int = Field(4, ge=2, le=10, description="Side of the square map, in cells.")
    p: float = Field(
        0.8, ge=0.6, le=1.0, description="Probability that a generated cell is frozen (not a hole)."
    )
    success_reward: Reward = Field(10.0, description="Reward for reaching the goal.")
    max_actions_per_turn: int = Field(3, ge=1, le=20, description="Most moves one turn may hold.")
    image_size: int | None = Field(
        None,
        ge=32,
        le=1024,
        description="Side of the square image in pixels; null keeps gymnasium's 64 px per cell.",
    )
    render_mode: Literal["vision", "text"] = Field(
        "vision",
        description="vision: the observation is the image; text: the map as a grid of "
        "symbols in the observation text, no image (VAGEN's render_mode).",
    )
    text_as: Literal["symbolic", "natural", "structured"] = Field(
        "symbolic",
        description="How render_mode text writes the state: symbolic, the grid of symbols "
        "(VAGEN's); natural, a sentence per object saying where it is from you; structured, "
        "JSON of [row, column] positions. Ignored in vision mode.",
    )


class FrozenLakeEnv(Environment):
    """Reach the goal across a frozen lake; stepping into a hole ends the episode."""

    name: ClassVar[str] = "frozenlake"
    Config: ClassVar[type[EnvConfig]] = FrozenLakeConfig
    description: ClassVar[str] = (
        "FrozenLake (gymnasium, not slippery) on a seeded map: walk to the goal, avoid the holes."
    )
    grading: ClassVar[GradingSpec] = GRADING

    config: FrozenLakeConfig

    def __init__(self, config: FrozenLakeConfig | None = None) -> None:
        super().__init__(config)
        self._gym: GymFrozenLake | None = None
        self._desc: tuple[str, ...] = ()

    @classmethod
    def action_space_for(cls, config: FrozenLakeConfig) -> ActionSpace:
        return ActionSpace(
            kind=ActionKind.DISCRETE,
            names=ACTIONS,
            max_per_turn=config.max_actions_per_turn,
            description="Left, Down, Right, Up: move one cell; the edge of the lake blocks.",
        )

    # ---- episode --------------------------------------------------------
    def _reset(self, seed: int) -> Observation:
        self._load(generate_map(self.config.size, self.config.p, seed), seed)
        return self._observation()

    def _load(self, desc: tuple[str, ...], seed: int) -> None:
        # the old gymnasium env is dropped, not closed: its close() quits pygame for the
        # whole process (slow, and shared with the other sessions of this worker)
        self._desc = desc
        self._gym = GymFrozenLake(desc=list(desc), is_slippery=False, render_mode="rgb_array")
        self._gym.reset(seed=seed)

    def _apply(self, actions: list[Action]) -> Transition:
        gym = self._require_gym()
        cfg = self.config
        reward, executed = 0.0, 0
        details: list[dict[str, Any]] = []
        invalid: list[str] = []
        skipped: list[str] = []
        for action in actions:
            name = self.action_space.lookup(action.name)
            if name is None:
                invalid.append(unknown_action(action, self.action_space))
                continue
            if self._tile() in "GH":
                skipped.append(name)  # the episode ended earlier in this turn
                continue
            before = int(gym.s)
            gym.step(ACTIONS.index(name))
            executed += 1
            detail: dict[str, Any] = {
                "name": name,
                "result": "moved" if int(gym.s) != before else "blocked",
                "reward": 0.0,
            }
            if self._tile() == "G":
                detail["event"] = "reached the goal"
                detail["reward"] = cfg.success_reward
                reward += cfg.success_reward
            elif self._tile() == "H":
                detail["event"] = "fell into a hole"
            details.append(detail)

        tile = self._tile()
        return Transition(
            observation=self._observation(),
            reward=reward,
            terminated=tile in "GH",
            truncated=False,
            success=tile == "G",
            actions_executed=executed,
            invalid_actions=invalid,
            info={"actions": details, "skipped_actions": skipped},
        )

    def close(self) -> None:
        # see _load: gymnasium's close() would quit pygame for every session in the process
        self._gym = None

    # ---- snapshot (gymnasium's pygame surfaces can't be deep-copied) ------
    def _snapshot(self) -> dict[str, Any]:
        gym = self._require_gym()
        state = {k: v for k, v in self.__dict__.items() if k != "_gym"}
        return {"state": copy.deepcopy(state), "s": int(gym.s), "lastaction": gym.lastaction}

    def _restore(self, snapshot: dict[str, Any]) -> None:
        state = copy.deepcopy(snapshot["state"])
        desc = tuple(state["_desc"])
        if self._gym is None or desc != self._desc:
            self._load(desc, seed=0)
        self.__dict__.update(state)
        gym = self._require_gym()
        gym.s = snapshot["s"]
        gym.lastaction = snapshot["lastaction"]

    # ---- observation ----------------------------------------------------
    def render(self) -> np.ndarray:
        """The current frame from gymnasium's renderer (resized if the config asks)."""
        return render.frame(self._require_gym(), self.config.image_size)

    def _observation(self) -> Observation:
        if self.config.render_mode == "text":
            state = self.describe(self.ground_truth(), Representation(self.config.text_as))
            text, images = f"[Observation]:\n{state}", []
        else:
            text, images = "[Observation]: <image>", [self.render()]
        return Observation(
            text=text,
            images=images,
            ground_truth=self.ground_truth(),
            info={"turn": self.turn, "max_turns": self.config.max_turns},
        )

    def ground_truth(self) -> dict[str, Any]:
        self._require_gym()
        player = list(self._player())
        goal = self._cells("G")[0]
        holes = self._cells("H")
        relations = [_relation("goal", player, goal)] + [
            _relation("hole", player, h) for h in holes
        ]
        return {
            "grid_size": [len(self._desc), len(self._desc[0])],
            "player": player,
            "goal": goal,
            "holes": holes,
            "relations": relations,
        }

    def describe(self, state: dict[str, Any], representation: Representation | str) -> str:
        try:
            representation = Representation(representation)
            player = [int(v) for v in state["player"]]
            goal = [int(v) for v in state["goal"]]
            holes = [[int(v) for v in h] for h in state["holes"]]
            if representation is Representation.STRUCTURED:
                return json.dumps({"player": player, "goal": goal, "hole": holes})
            if representation is Representation.NATURAL:
                return " ".join(
                    [grid_sentence("goal", "player", player, goal)]
                    + [grid_sentence("hole", "player", player, h) for h in holes]
                )
            return symbolic(state["grid_size"], player, goal, holes)
        except (KeyError, TypeError, ValueError, IndexError) as exc:
            raise EnvError(f"describe(): not a FrozenLake ground-truth state ({exc!r})") from exc

    def system_prompt(self, format: ResponseFormat | str) -> str:
        n = self.config.max_actions_per_turn
        view = (
            "The image shows the lake from above: light blue ice cells are safe, dark blue "
            "holes are deadly, the cell with the flag (marked G) is the goal, the start cell "
            "is marked S, and the small figure is you.\n"
            if self.config.render_mode == "vision"
            else f"Each observation shows the lake as text ({TEXT_AS[self.config.text_as]}).\n"
        )
        return (
            "You are playing FrozenLake. Walk across the frozen lake to the goal without "
            "falling into a hole.\n"
            "Rules: you move one cell per action and never slip; walking off the edge of the "
            "lake does nothing; stepping into a hole ends the game; reaching the goal wins.\n"
            f"{view}"
            "As text, the lake is written one row per line, one symbol per cell: "
            f"{FROZEN} frozen ice, {HOLE} hole, {GOAL} goal, {PLAYER} you, {PLAYER_IN_HOLE} you in "
            f"a hole, {PLAYER_ON_GOAL} you on the goal. Positions are [row, column], row 0 at "
            "the top, column 0 on the left.\n"
            f"Actions: {', '.join(ACTIONS)}. You may give up to {n} action(s) per turn, "
            "separated by commas; they are executed in order.\n"
            f"Reward: {self.config.success_reward:+g} for reaching the goal, 0 otherwise."
        )

    # ---- oracle -----------------------------------------------------------
    def _oracle(self) -> list[Action]:
        """The next moves of a shortest safe path to the goal."""
        return [Action(name) for name in shortest_path(self._desc, self._player(), DELTAS)]

    # ---- helpers --------------------------------------------------------
    def _require_gym(self) -> GymFrozenLake:
        if self._gym is None:
            raise no_episode()
        return self._gym

    def _player(self) -> tuple[int, int]:
        return divmod(int(self._require_gym().s), len(self._desc[0]))

    def _tile(self) -> str:
        r, c = self._player()
        return self._desc[r][c]

    def _cells(self, letter: str) -> list[list[int]]:
        return [
            [r, c] for r, row in enumerate(self._desc) for c, ch in enumerate(row) if ch == letter
        ]


def generate_map(size: int, p: float, seed: int) -> tuple[str, ...]:
    """A size x size map from `seed`: each cell frozen with probability `p`, else a hole;
    a start (S) and a goal (G) on two distinct random cells. Drawn again (from the same
    generator) until the oracle's search finds a safe path from S to G, so every level
    is solvable. Rows of "S", "F", "H", "G", as gymnasium's FrozenLake reads them."""
    rng = np.random.default_rng(seed)
    while True:
        cells = np.where(rng.random((size, size)) < p, "F", "H")
        start, goal = rng.choice(size * size, size=2, replace=False)
        cells[divmod(int(start), size)] = "S"
        cells[divmod(int(goal), size)] = "G"
        desc = tuple("".join(row) for row in cells)
        if shortest_path(desc, divmod(int(start), size), DELTAS):
            return desc


def _relation(kind: str, player: list[int], pos: list[int]) -> dict[str, Any]:
    vertical, horizontal = grid_relation(player, pos)
    return {"object": kind, "position": list(pos), "vertical": vertical, "horizontal": horizontal}
