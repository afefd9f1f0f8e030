"""A tiny real environment for service tests: a corridor of cells, reach the right end.

It exists so the service can be tested for failure paths real environments should
never take: the action `Crash` raises inside `step` (an environment bug), `Exit`
kills the worker process, `Hang` never returns (a stuck environment), seed 666 makes
`reset` raise, and seed 667 puts an object no JSON can hold into the ground truth.
"""

from __future__ import annotations

import json
import os
import time
from typing import Any

import numpy as np
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

SPACE = ActionSpace(ActionKind.DISCRETE, ("Left", "Right", "Crash", "Exit", "Hang"), max_per_turn=2)
CELL = 8


class TinyConfig(EnvConfig):
    length: int = Field(4, ge=2, le=32, description="Cells in the corridor.")


class TinyEnv(Environment):
    name = "tiny"
    Config = TinyConfig
    description = "A corridor: walk Right to the goal."
    action_space = SPACE  # class attribute: no instance needed to list it

    def reset(self, seed: int) -> Observation:
        if seed == 666:
            raise RuntimeError("tiny env failed to reset on purpose")
        self.unencodable = seed == 667
        self.pos = int(seed) % (self.config.length - 1)
        self.turns = 0
        return self._obs()

    def _obs(self) -> Observation:
        image = np.zeros((CELL, CELL * self.config.length, 3), np.uint8)
        image[:, CELL * self.pos : CELL * (self.pos + 1)] = (255, 0, 0)
        image[:, -CELL:, 1] = 255
        return Observation("Corridor: <image>", [image], self.ground_truth())

    def step(self, actions: list[Action]) -> Transition:
        if self.pos == self.config.length - 1 or self.turns >= self.config.max_turns:
            raise EnvError("episode over", code="FAILED_PRECONDITION")
        self.turns += 1
        executed, invalid, reward = 0, [], 0.0
        for action in actions[: SPACE.max_per_turn]:
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
        reward = 10.0 if success else -0.1
        return Transition(
            self._obs(),
            reward,
            terminated=success,
            truncated=not success and self.turns >= self.config.max_turns,
            success=success,
            actions_executed=executed,
            invalid_actions=invalid,
        )

    def ground_truth(self) -> dict[str, Any]:
        state = {"player": [0, self.pos], "goal": [0, self.config.length - 1]}
        if getattr(self, "unencodable", False):
            state["thing"] = object()
        return state

    def describe(self, state: dict[str, Any], representation: Representation) -> str:
        if representation == Representation.STRUCTURED:
            return json.dumps(state)
        return f"The player is at cell {state['player'][1]}; the goal at {state['goal'][1]}."

    def system_prompt(self, format: ResponseFormat) -> str:
        return "Walk Right until you reach the goal. Actions: Left, Right."

    def oracle_actions(self) -> list[Action]:
        steps = self.config.length - 1 - self.pos
        return [Action("Right")] * min(steps, SPACE.max_per_turn)
