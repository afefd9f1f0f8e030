"""The environment contract every visenv environment implements.

Lifecycle (as in gymnasium's `Env` and dm_env's `Environment`):

    env = SomeEnv(SomeEnv.Config(...))
    obs = env.reset(seed=7)            # seed -> the same level, images and rewards, always
    tr = env.step([Action("Left")])    # a whole turn: up to max_actions_per_turn actions
    ...                                # until tr.terminated or tr.truncated
    env.close()

Seeding rules: `reset(seed)` fully determines the episode. An environment holds no
hidden global randomness; every random choice comes from a generator created from
the seed at reset. Stepping before reset or after the episode ended is an `EnvError`
(FAILED_PRECONDITION), raised by the base class with one wording for every environment.

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
from enum import Enum
from typing import Annotated, Any, ClassVar

import numpy as np
from pydantic import BaseModel, ConfigDict, Field

from .spatial import GradingSpec
from .types import (
    Action,
    ActionSpace,
    EnvError,
    Observation,
    Representation,
    ResponseFormat,
    Transition,
)


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


# Every reward option a session may set (an environment's config, the reasoning options):
# a finite number within +-REWARD_LIMIT, so that no sum of a turn's or an episode's parts
# can overflow into a reply that can't be written (a NaN or an infinity)
REWARD_LIMIT = 1e6
Reward = Annotated[float, Field(ge=-REWARD_LIMIT, le=REWARD_LIMIT, allow_inf_nan=False)]


class EnvConfig(BaseModel):
    """Options every environment takes; environments extend it with their own.

    Unknown keys are refused so that a typo in a config never passes silently.
    """

    model_config = ConfigDict(extra="forbid")

    max_turns: int = Field(10, ge=1, le=1000, description="Turns before the episode is truncated.")


# One wording per error, shared by every environment (the base class raises them).
STEP_BEFORE_RESET = "step() before reset(): reset the episode first"
EPISODE_ENDED = "the episode has ended; reset it to play again"
ORACLE_BEFORE_RESET = "oracle_actions() before reset(): reset the episode first"
NO_EPISODE = "no episode yet: reset the environment first"


def no_episode() -> EnvError:
    """The error of reading an environment's state (its ground truth, image or snapshot)
    before its first reset; environments raise it from their own state accessors."""
    return EnvError(NO_EPISODE, "FAILED_PRECONDITION")


# A refusal in `invalid_actions` names what it refuses, but never echoes a long input
# whole: a reply (and the copy a session keeps of it) stays small whatever was sent
SHOWN_NAME = 80  # characters of an action's name in a refusal
MAX_REFUSAL = 1000  # characters of one invalid_actions entry


def shown(text: str, limit: int = SHOWN_NAME) -> str:
    """`text` as a refusal names it: whole up to `limit` characters, else its start and length."""
    return text if len(text) <= limit else f"{text[:limit]}... ({len(text)} characters)"


def over_limit(action: Action, limit: int) -> str:
    """The refusal of an action past the per-turn limit."""
    return f"{shown(action.name)}: over the limit of {limit} actions per turn"


def unknown_action(action: Action, space: ActionSpace) -> str:
    """The refusal of an action whose name is not in the action space."""
    return f"{shown(action.name)}: unknown action; use one of {', '.join(space.names)}"


# The one seed rule of every environment: an integer in [0, SEED_LIMIT) (booleans and
# strings are not seeds). An environment whose random generator takes fewer bits
# (`seed_bits`) gets a seed derived from it deterministically (`Environment.reset`).
SEED_LIMIT = 2**63


def check_seed(seed: Any) -> int:
    """`seed` as an int, or EnvError (INVALID_ARGUMENT, field "seed") if it breaks the rule."""
    if (
        isinstance(seed, bool)
        or not isinstance(seed, int | np.integer)
        or not 0 <= seed < SEED_LIMIT
    ):
        raise EnvError(f"seed must be an integer in [0, 2**63), got {seed!r}", field="seed")
    return int(seed)


def narrow_seed(seed: int, bits: int) -> int:
    """`seed` itself when it fits in `bits` bits, else one derived from it deterministically
    (numpy's SeedSequence hash): distinct seeds stay distinct with high probability."""
    if seed < 2**bits:
        return seed
    state = np.random.SeedSequence(seed).generate_state(2, np.uint32)
    return int((int(state[0]) << 32 | int(state[1])) % 2**bits)


class Environment(ABC):
    """Abstract base class of all environments.

    What a subclass declares (the framework reads these and nothing else):

    - `name`, `Config` (a pydantic model deriving from `EnvConfig`), `description`;
    - `action_space_for(config)`: the action space a config gives, readable without
      building an environment (the server lists it); `self.action_space` holds it;
    - `grading`: how `reasoning/` grades `<observation>`/`<prediction>` texts of this
      environment's states with its generic grid/position grader, or `grade_description`
      overridden to grade them itself (then `grading` may be None);
    - `render_answer(action)`: the picture an agent's answer draws, where there is one
      (the svg environment renders the agent's SVG); None otherwise;
    - `state_prompt(rep)`, `fork_tolerance`, `fixed_ground_truth`, `thread_bound`,
      `unavailable_reason()`, `_snapshot` / `_restore` where they differ from the defaults.

    What the base class does, in one place, for every environment (as gymnasium's
    `TimeLimit` and `PassiveEnvChecker` do around an `Env`):

    - `reset(seed)` checks the seed, starts the turn count and calls `_reset(seed)`;
    - `step(actions)` refuses a step before reset and after the episode ended (the
      FAILED_PRECONDITION errors, one wording each), cuts the turn to
      `action_space.max_per_turn` actions (the rest are reported as invalid), counts the
      turn, calls `_apply(actions)` and truncates the episode when `config.max_turns`
      turns have been played and it has not terminated;
    - `oracle_actions()` refuses before reset, answers [] once the episode ended, and
      otherwise asks `_oracle()`;
    - `snapshot()` / `restore()` carry its own counters (turn, episode phase) beside the
      environment's `_snapshot()` / `_restore()`.

    So an environment implements `_reset`, `_apply`, `_oracle`, `ground_truth`,
    `describe` and `system_prompt`, and reads `self.turn` (turns played, counting the
    one being applied) and `self.refused` (this turn's actions past the limit) where it
    needs them.
    """

    name: ClassVar[str]
    Config: ClassVar[type[EnvConfig]] = EnvConfig
    description: ClassVar[str] = ""
    # how reasoning/'s generic grader reads this environment's states; None when the
    # environment grades descriptions itself (grade_description)
    grading: ClassVar[GradingSpec | None] = GradingSpec()
    # None: a restored snapshot (a forked session) answers every action exactly as the
    # original would; otherwise what may differ, said to clients in the fork's reply
    fork_tolerance: ClassVar[str | None] = None
    # how many bits of seed the environment's random generator takes: a larger seed is
    # mapped onto them (`narrow_seed`) before `_reset` sees it (ManiSkill: 32)
    seed_bits: ClassVar[int] = 63
    # ground-truth keys whose values the environment never changes in place (a room's
    # walls, handed out as the same objects every step of an episode): the worker checks
    # and encodes such a value once, while the ground truth holds that same object
    fixed_ground_truth: ClassVar[frozenset[str]] = frozenset()
    # True when instances hold state bound to the thread that made them (an OpenGL
    # context is current in one thread at a time): a worker builds, steps and pre-warms
    # such an environment on its main thread only, never in its pre-warm thread
    thread_bound: ClassVar[bool] = False

    def __init__(self, config: EnvConfig | None = None) -> None:
        self.config = config if config is not None else self.Config()
        self.action_space: ActionSpace = self.action_space_for(self.config)
        self.turn = 0  # turns played in this episode
        # this turn's actions past the per-turn limit, refused (already worded), for an
        # environment whose observation text reports refused actions; the base class adds
        # them to the transition's invalid_actions after `_apply`
        self.refused: list[str] = []
        self._phase = _Phase.NEW

    # ---- availability -------------------------------------------------
    @classmethod
    def unavailable_reason(cls) -> str | None:
        """Why this environment cannot run on this machine, or None if it can.

        Environments with heavy backends (a simulator, a GPU driver) override this so
        that the server can list them as unavailable instead of failing at start-up.
        """
        return None

    # ---- what the subclass declares ------------------------------------
    @classmethod
    @abstractmethod
    def action_space_for(cls, config: EnvConfig) -> ActionSpace:
        """The action space an environment with `config` has."""

    # ---- the lifecycle, done here for every environment ----------------
    def reset(self, seed: int) -> Observation:
        """Start a new episode determined entirely by `seed`."""
        seed = narrow_seed(check_seed(seed), self.seed_bits)
        self._phase = _Phase.NEW
        self.turn = 0
        observation = self._reset(seed)
        self._phase = _Phase.RUNNING
        return observation

    def step(self, actions: list[Action]) -> Transition:
        """Apply up to `action_space.max_per_turn` actions (one turn).

        Invalid actions are reported in `Transition.invalid_actions`, never raised.
        """
        if self._phase is _Phase.NEW:
            raise EnvError(STEP_BEFORE_RESET, "FAILED_PRECONDITION")
        if self._phase is _Phase.ENDED:
            raise EnvError(EPISODE_ENDED, "FAILED_PRECONDITION")
        limit = self.action_space.max_per_turn
        self.turn += 1
        self.refused = [over_limit(a, limit) for a in actions[limit:]]
        transition = self._apply(list(actions[:limit]))
        transition.invalid_actions.extend(self.refused)
        transition.invalid_actions[:] = [shown(m, MAX_REFUSAL) for m in transition.invalid_actions]
        if not transition.terminated and self.turn >= self.config.max_turns:
            transition.truncated = True
        if transition.terminated or transition.truncated:
            self._phase = _Phase.ENDED
        return transition

    def oracle_actions(self) -> list[Action]:
        """An expert's next actions from the current state (at most one turn's worth);
        [] once the episode has ended."""
        if self._phase is _Phase.NEW:
            raise EnvError(ORACLE_BEFORE_RESET, "FAILED_PRECONDITION")
        if self._phase is _Phase.ENDED:
            return []
        return self._oracle()[: self.action_space.max_per_turn]

    @property
    def episode_over(self) -> bool:
        """True once the episode terminated or was truncated (until the next reset)."""
        return self._phase is _Phase.ENDED

    @property
    def last_turn(self) -> bool:
        """True while the turn being applied is the last one `max_turns` allows."""
        return self.turn >= self.config.max_turns

    # ---- what the subclass implements ----------------------------------
    @abstractmethod
    def _reset(self, seed: int) -> Observation:
        """Start the episode of `seed` (already checked) and return its first observation."""

    @abstractmethod
    def _apply(self, actions: list[Action]) -> Transition:
        """Apply one turn's actions (at most `max_per_turn`; `self.turn` already counts
        this turn). Leave `truncated` False unless the environment has its own budget:
        the base class truncates at `max_turns`."""

    @abstractmethod
    def _oracle(self) -> list[Action]:
        """An expert's next actions from the current, running state."""

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

    def close(self) -> None:
        """Release resources (simulators, renderer contexts). Safe to call twice."""

    # ---- optional, with defaults ----------------------------------------
    def grade_description(
        self, text: str, truth: dict[str, Any], representation: Representation
    ) -> float | None:
        """A score in [0, 1] for `text` describing the state `truth` (the parsed
        structured description), or None (the default): grade it with `grading`."""
        return None

    @property
    def grades_descriptions(self) -> bool:
        """Whether this environment overrides `grade_description`."""
        return type(self).grade_description is not Environment.grade_description

    def render_answer(self, action: Action) -> np.ndarray | None:
        """The image an agent's answer draws (RGB uint8), or None where answers draw nothing."""
        return None

    def state_prompt(self, representation: Representation) -> StatePrompt | None:
        """How the agent writes a state in `representation`, with an example (see the
        module docstring); None (the default) means the generic grid instructions built
        from the environment's `GradingSpec` fit."""
        return None

    def snapshot(self) -> Any:
        """An opaque copy of the whole state, so a session can be forked: the episode's
        counters kept by this base class, and the environment's own state (`_snapshot`)."""
        return self.turn, self._phase, self._snapshot()

    def restore(self, snapshot: Any) -> None:
        turn, phase, state = snapshot
        self._restore(state)  # may reset the environment first (a simulator's scene)
        self.turn, self._phase = turn, phase

    def _snapshot(self) -> Any:
        """The environment's own state. The default deep-copies the instance's attributes;
        environments that hold simulator handles override `_snapshot` and `_restore`, or
        raise NotImplementedError (their sessions can't be forked)."""
        return copy.deepcopy(self.__dict__)

    def _restore(self, state: Any) -> None:
        self.__dict__.update(copy.deepcopy(state))


class _Phase(Enum):
    NEW = "new"  # built or being reset: no episode to step
    RUNNING = "running"
    ENDED = "ended"  # terminated or truncated
