"""UFO's unary feedback, an option of the single-turn environments (vicrit, svg).

Unary Feedback as Observation (UFO, "A Simple 'Try Again' Can Elicit Multi-Turn LLM
Reasoning") turns a one-answer task into a multi-turn one: after a wrong answer the
next observation is only a fixed phrase ("Let's try again.") with no hint, and the agent
answers again, up to `max_attempts` times. Rewards favour solving in fewer attempts and
discourage repeating an earlier answer:

    reward(attempt k) = base_reward * reward_decay ** (k - 1) - (repeat_penalty if repeated)

where `base_reward` is the environment's own reward for the answer (1/0 for vicrit's exact
match, the similarity score for svg) and "repeated" means the answer equals (after the
environment's normalisation) one given earlier in the episode. A correct answer ends the
episode (terminated); running out of attempts ends it too (truncated: the attempts are the
episode's `max_turns`, one answer per turn, so `Environment.step` truncates the last one;
`Attempt.truncated` says the same).

An environment opts in by deriving its config from `FeedbackConfig` and keeping an
`Attempts` record in its episode state; in its `_apply`:

    attempt = episode.attempts.record(self.config, key=normalised_answer, correct=ok,
                                      base_reward=r)  # counts it against max_turns
    ... reward=attempt.reward, terminated=attempt.correct (the base class truncates)
    ... info.update(attempt.info())
    ... observation: `feedback_observation(cfg, ground_truth)` after a wrong answer when unary

Under `feedback: "unary"` an episode lasts at most `max_attempts` answers, and the
config's `max_turns` says the same (it is set to `max_attempts` when left out; giving a
different value is refused), so clients that read `max_turns` see the real length.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

from pydantic import Field, ValidationInfo, field_validator, model_validator

from env_server.core import EnvConfig, Observation

DEFAULT_PHRASE = "Let's try again."


class FeedbackConfig(EnvConfig):
    """Config fields of an environment that offers UFO's unary feedback."""

    feedback: Literal["none", "unary"] = Field(
        "none",
        validate_default=True,  # so that subclasses' checks of it run on the default too
        description="none: the environment's own feedback; unary: after a wrong answer the "
        "observation is only `feedback_phrase` (UFO), for up to `max_attempts` answers.",
    )
    max_attempts: int = Field(
        3, ge=1, le=100, description="Answers per episode under unary feedback."
    )
    feedback_phrase: str = Field(
        DEFAULT_PHRASE,
        min_length=1,
        max_length=500,
        description="The environment's whole observation after a wrong answer under unary "
        "feedback (a session adds the format reminder it adds to every observation).",
    )
    reward_decay: float = Field(
        0.8,
        ge=0.0,
        le=1.0,
        description="Under unary feedback the k-th answer's reward is multiplied by "
        "reward_decay ** (k - 1).",
    )
    repeat_penalty: float = Field(
        0.2,
        ge=0.0,
        le=100.0,
        description="Under unary feedback, subtracted from the reward of an answer that "
        "repeats an earlier one of the episode.",
    )

    @model_validator(mode="before")
    @classmethod
    def _episode_length_from_attempts(cls, data: Any) -> Any:
        # under unary feedback max_turns defaults to max_attempts (one turn per answer)
        if isinstance(data, dict) and data.get("feedback") == "unary" and "max_turns" not in data:
            attempts = data.get("max_attempts", cls.model_fields["max_attempts"].default)
            data = {**data, "max_turns": attempts}
        return data

    @field_validator("max_attempts")
    @classmethod
    def _turns_match_attempts(cls, attempts: int, info: ValidationInfo) -> int:
        turns = info.data.get("max_turns")
        if info.data.get("feedback") == "unary" and turns is not None and turns != attempts:
            raise ValueError(
                f"under unary feedback an episode lasts max_attempts answers ({attempts}); "
                f"leave max_turns out or set it to the same number (got {turns})"
            )
        return attempts

    @property
    def unary(self) -> bool:
        return self.feedback == "unary"


@dataclass(frozen=True)
class Attempt:
    """The outcome of one answer: its number (1-based), whether it repeated an earlier
    answer, whether it was correct, the reward and whether attempts are used up."""

    number: int
    max_attempts: int
    repeated: bool
    correct: bool
    reward: float
    truncated: bool

    @property
    def done(self) -> bool:
        return self.correct or self.truncated

    def info(self) -> dict[str, Any]:
        return {
            "attempt": self.number,
            "max_attempts": self.max_attempts,
            "repeated": self.repeated,
            "attempts_left": 0 if self.done else self.max_attempts - self.number,
        }


@dataclass
class Attempts:
    """The answers given so far in one episode (normalised keys; part of the episode's
    state, so it is copied with a snapshot)."""

    keys: list[str | None] = field(default_factory=list)

    @property
    def count(self) -> int:
        return len(self.keys)

    def record(
        self,
        cfg: FeedbackConfig,
        *,
        key: str | None,
        correct: bool,
        base_reward: float,
    ) -> Attempt:
        """Count one answer and work out its reward.

        `key` identifies the answer for the repeat check (None: nothing was answered, e.g.
        an unparsable response, which never counts as a repeat). The episode allows
        `cfg.max_turns` answers (equal to `max_attempts` under unary feedback). Decay and
        repeat penalty apply under unary feedback only; without it the reward is
        `base_reward` unchanged.
        """
        repeated = key is not None and key in self.keys
        self.keys.append(key)
        number, limit = len(self.keys), cfg.max_turns
        reward = float(base_reward)
        if cfg.unary:
            reward *= cfg.reward_decay ** (number - 1)
            if repeated:
                reward -= cfg.repeat_penalty
        return Attempt(
            number=number,
            max_attempts=limit,
            repeated=repeated,
            correct=bool(correct),
            reward=reward,
            truncated=not correct and number >= limit,
        )


def feedback_observation(cfg: FeedbackConfig, ground_truth: dict[str, Any]) -> Observation:
    """The observation after a wrong answer under unary feedback: the phrase, nothing else."""
    return Observation(text=cfg.feedback_phrase, images=[], ground_truth=ground_truth)
