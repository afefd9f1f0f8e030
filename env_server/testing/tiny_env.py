"""`TinyEnv` (registered by tests as "tiny", `env_server.testing:TinyEnv`): a small real
environment whose actions and seeds make the failures a server must survive."""

from __future__ import annotations

import json
import os
import time
from typing import Any, ClassVar

import numpy as np
from pydantic import Field

from env_server.core import (
    Action,
    ActionKind,
    ActionSpace,
    EnvConfig,
    Environment,
    Observation,
    Representation,
    ResponseFormat,
    Transition,
)


class TinyConfig(EnvConfig):
    """Options of the tiny corridor."""

    length: int = Field(4, ge=2, le=32, description="Cells in the corridor.")
    reset_delay: float = Field(
        0.0, ge=0, le=1, description="Seconds each reset takes (a slow environment)."
    )


TINY_PATH = "env_server.testing:TinyEnv"  # the import path servers load it from
TINY_CELL = 8  # pixels per cell side
TINY_SPACE = ActionSpace(
    ActionKind.DISCRETE, ("Left", "Right", "Crash", "Exit", "Hang"), max_per_turn=2
)


class TinyEnv(Environment):
    """A corridor of cells: walk Right to the goal at the far end.

    A real environment for testing a server's failure paths, which real environments
    should never take: the action `Crash` raises inside `step` (an environment bug),
    `Exit` kills the worker process, `Hang` never returns (a stuck environment), seed 666
    makes `reset` raise, seed 667 puts an object no JSON can hold into the ground
    truth, and seed 668 a NaN once the player has moved (a reply that can't be written). Tests register it by its import path:
    `{"tiny": "env_server.testing:TinyEnv"}`
    (`Settings.env_paths`, or `VISENV_ENV_PATHS` for a `visenv serve`).
    """

    name: ClassVar[str] = "tiny"
    Config: ClassVar[type[EnvConfig]] = TinyConfig
    description: ClassVar[str] = "A corridor: walk Right to the goal."

    config: TinyConfig

    @classmethod
    def action_space_for(cls, config: EnvConfig) -> ActionSpace:
        return TINY_SPACE

    def _reset(self, seed: int) -> Observation:
        if seed == 666:
            raise RuntimeError("tiny env failed to reset on purpose")
        time.sleep(self.config.reset_delay)
        self.unencodable = seed == 667
        self.nan_after_move = seed == 668
        self.start = seed % (self.config.length - 1)
        self.pos = seed % (self.config.length - 1)
        return self._obs()

    def _obs(self) -> Observation:
        length = self.config.length
        image = np.zeros((TINY_CELL, TINY_CELL * length, 3), np.uint8)
        image[:, TINY_CELL * self.pos : TINY_CELL * (self.pos + 1)] = (255, 0, 0)
        image[:, -TINY_CELL:, 1] = 255
        return Observation("Corridor: <image>", [image], self.ground_truth())

    def _apply(self, actions: list[Action]) -> Transition:
        executed, invalid = 0, []
        for action in actions:
            if action.name == "Crash":
                raise RuntimeError("tiny env crashed on purpose")
            if action.name == "Exit":
                os._exit(3)
            if action.name == "Hang":
                while True:
                    time.sleep(0.05)
            if action.name not in ("Left", "Right"):
                invalid.append(f"{action.name}: unknown action")
                break
            self.pos = max(0, self.pos + (1 if action.name == "Right" else -1))
            executed += 1
        success = self.pos == self.config.length - 1
        return Transition(
            self._obs(),
            10.0 if success else -0.1,
            terminated=success,
            truncated=False,
            success=success,
            actions_executed=executed,
            invalid_actions=invalid,
        )

    def ground_truth(self) -> dict[str, Any]:
        state: dict[str, Any] = {"player": [0, self.pos], "goal": [0, self.config.length - 1]}
        if self.unencodable:
            state["thing"] = object()
        if getattr(self, "nan_after_move", False) and self.pos != self.start:
            state["distance"] = float("nan")
        return state

    def describe(self, state: dict[str, Any], representation: Representation) -> str:
        if representation == Representation.STRUCTURED:
            return json.dumps(state)
        return f"The player is at cell {state['player'][1]}; the goal at {state['goal'][1]}."

    def system_prompt(self, format: ResponseFormat) -> str:
        return "Walk Right until you reach the goal. Actions: Left, Right."

    def _oracle(self) -> list[Action]:
        return [Action("Right")] * (self.config.length - 1 - self.pos)
