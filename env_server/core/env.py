"""The environment contract every visenv environment implements.

Lifecycle (as in gymnasium's `Env` and dm_env's `Environment`):

    env = SomeEnv(SomeEnv.Config(...))
    obs = env.reset(seed=7)            # seed -> the same level, images and rewards, always
    tr = env.step([Action("Left")])    # a whole turn: up to max_actions_per_turn actions
    ...                                # until tr.terminated or tr.truncated
    env.close()

Seeding rules: `reset(seed)` fully determines the episode. An environment holds no
hidden global randomness; every random choice comes from a generator created from
the seed at reset. Stepping after the episode ended is an `EnvError`.

World-model prompts: `reasoning/` tells the agent how to write a state in the session's
representation (inside `<observation>` / `<prediction>`) and shows an example. Grid
environments get this from their `GradingSpec`; an environment whose states are not
grid positions (continuous coordinates, an egocentric frame, a picture) overrides
`state_prompt(rep)` and returns a `StatePrompt`: the instruction sentence, a short
reminder, and a made-up example state before and after one answer, written with its own
`describe` so that the example uses exactly the words, symbols or keys its grader reads.
"""

from __future__ import annotations

import copy
from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import Any, ClassVar

from pydantic import BaseModel, ConfigDict, Field

from .types import Action, ActionSpace, Observation, Representation, ResponseFormat, Transition


@dataclass(frozen=True)
class StatePrompt:
    """How to write a state in one representation, with a gradable example.

    - `instruction`: the sentence(s) telling the agent how `<observation>` and
      `<prediction>` describe a state (the environment's own terms and units).
    - `reminder`: a short phrase for the per-turn reminder ("states written ...").
    - `before`, `after`: made-up ground-truth states, before and after `answer`.
    - `answer`: the example answer text (actions as the agent writes them).
    - `observation`, `prediction`: `describe(before)` and `describe(after)` in the
      representation (build with `StatePrompt.written`).
    """

    instruction: str
    reminder: str
    before: dict[str, Any]
    after: dict[str, Any]
    answer: str
    observation: str
    prediction: str

    @classmethod
    def written(
        cls,
        env: Environment,
        representation: Representation,
        *,
        instruction: str,
        reminder: str,
        before: dict[str, Any],
        after: dict[str, Any],
        answer: str,
    ) -> StatePrompt:
        """A StatePrompt whose example texts are `env.describe` of the example states."""
        return cls(
            instruction=instruction,
            reminder=reminder,
            before=before,
            after=after,
            answer=answer,
            observation=env.describe(before, representation),
            prediction=env.describe(after, representation),
        )


class EnvConfig(BaseModel):
    """Options every environment takes; environments extend it with their own.

    Unknown keys are refused so that a typo in a config never passes silently.
    """

    model_config = ConfigDict(extra="forbid")

    max_turns: int = Field(10, ge=1, le=1000, description="Turns before the episode is truncated.")


class Environment(ABC):
    """Abstract base class of all environments.

    Subclasses set `name`, `Config` (a pydantic model deriving from `EnvConfig`) and
    `action_space`, and implement the abstract methods.
    """

    name: ClassVar[str]
    Config: ClassVar[type[EnvConfig]] = EnvConfig
    description: ClassVar[str] = ""
    # None: a restored snapshot (a forked session) answers every action exactly as the
    # original would; otherwise what may differ, said to clients in the fork's reply
    fork_tolerance: ClassVar[str | None] = None

    def __init__(self, config: EnvConfig | None = None) -> None:
        self.config = config if config is not None else self.Config()

    # ---- availability -------------------------------------------------
    @classmethod
    def unavailable_reason(cls) -> str | None:
        """Why this environment cannot run on this machine, or None if it can.

        Environments with heavy backends (a simulator, a GPU driver) override this so
        that the server can list them as unavailable instead of failing at start-up.
        """
        return None

    # ---- the contract -------------------------------------------------
    @property
    @abstractmethod
    def action_space(self) -> ActionSpace: ...

    @abstractmethod
    def reset(self, seed: int) -> Observation:
        """Start a new episode determined entirely by `seed`."""

    @abstractmethod
    def step(self, actions: list[Action]) -> Transition:
        """Apply up to `action_space.max_per_turn` actions (one turn).

        Invalid actions are reported in `Transition.invalid_actions`, never raised.
        """

    @abstractmethod
    def ground_truth(self) -> dict[str, Any]:
        """The true current state as JSON-able data."""

    @abstractmethod
    def describe(self, state: dict[str, Any], representation: Representation) -> str:
        """`state` (a ground-truth dict) written as text in `representation`."""

    @abstractmethod
    def system_prompt(self, format: ResponseFormat) -> str:
        """The environment's part of the system prompt: rules, actions, an example.

        `reasoning/` adds the response-format instructions around it.
        """

    @abstractmethod
    def oracle_actions(self) -> list[Action]:
        """An expert's next actions from the current state (at most one turn's worth)."""

    def close(self) -> None:
        """Release resources (simulators, renderer contexts). Safe to call twice."""

    # ---- optional -----------------------------------------------------
    def state_prompt(self, representation: Representation) -> StatePrompt | None:
        """How the agent writes a state in `representation`, with an example (see the
        module docstring); None (the default) means the generic grid instructions built
        from the environment's `GradingSpec` fit."""
        return None

    def snapshot(self) -> Any:
        """An opaque copy of the whole state, so a session can be forked.

        The default deep-copies the instance's attributes; environments that hold
        simulator handles override both methods or raise NotImplementedError.
        """
        return copy.deepcopy(self.__dict__)

    def restore(self, snapshot: Any) -> None:
        self.__dict__.update(copy.deepcopy(snapshot))
