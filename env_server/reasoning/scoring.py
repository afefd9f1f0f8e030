"""Turn rewards from reasoning: the format reward and the rule-based world-model reward.

Per turn (VAGEN): r_reason = beta_s * observation_score + beta_w * prediction_score,
given only when the format reward was earned; r_format = cfg.format_reward for a
well-formed response whose actions are all valid (parse-valid and none of them
refused by the environment, i.e. `Transition.invalid_actions` is empty).

`observation_score` grades `<observation>` against the state *before* the step,
`prediction_score` grades `<prediction>` against the state *after* it. A score is
None when the format has no such section or the response was malformed; otherwise
it is reported even when the reward is withheld (so a trainer can see it). A state
that cannot be graded in the session's representation (an environment bug or a
representation it doesn't support; `check_representation` refuses those at session
creation) leaves both scores None and says why in `info["grading_error"]`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from env_server.core.env import Environment
from env_server.core.types import Representation, ResponseFormat, Transition

from .config import ReasoningConfig
from .formats import ParsedResponse
from .grading import cached_grading_state, grade_for_env, grading_state


@dataclass
class TurnScore:
    """The reasoning part of one turn's reward.

    `format`: the format reward earned; `world_model`: beta_s * obs + beta_w * pred (0
    when the format reward was not earned); `judge_error`: why the LLM judge failed
    (then the scores are the rule-based fallback, or None without fallback).
    """

    format: float
    observation_score: float | None
    prediction_score: float | None
    world_model: float
    judge_error: str | None = None
    info: dict[str, Any] = field(default_factory=dict)

    def __reduce__(self):  # pickled per step (worker -> service): as its field values
        return (TurnScore, (self.format, self.observation_score, self.prediction_score,
                            self.world_model, self.judge_error, self.info))  # fmt: skip

    @property
    def total(self) -> float:
        return self.format + self.world_model

    @property
    def guard_score(self) -> float:
        """The score the reward-hacking guard judges a response by: the mean of the
        world-model scores present; without any, 1 if the format reward was earned, else 0."""
        scores = [s for s in (self.observation_score, self.prediction_score) if s is not None]
        if scores:
            return sum(scores) / len(scores)
        return 1.0 if self.format > 0 else 0.0


def format_earned(parsed: ParsedResponse, transition: Transition | None) -> bool:
    """Well-formed, every action parsed and none refused by the environment."""
    refused = transition is not None and bool(transition.invalid_actions)
    return parsed.format_ok and not refused


def world_model_reward(
    earned: bool, obs: float | None, pred: float | None, cfg: ReasoningConfig
) -> float:
    if not earned:
        return 0.0
    return cfg.beta_s * (obs or 0.0) + cfg.beta_w * (pred or 0.0)


def score_turn(
    env: Environment,
    parsed: ParsedResponse,
    transition: Transition | None,
    gt_before: dict[str, Any],
    gt_after: dict[str, Any],
    fmt: ResponseFormat | str,
    rep: Representation | str,
    cfg: ReasoningConfig,
) -> TurnScore:
    """Rule-based reasoning reward of one turn (sync; runs next to the environment).

    `gt_before` / `gt_after` are `env.ground_truth()` before and after the step.
    """
    rep = Representation(rep)
    earned = format_earned(parsed, transition)
    info: dict[str, Any] = {}
    if parsed.error is not None:
        info["parse_error"] = parsed.error
    elif transition is not None and transition.invalid_actions:
        info["refused_actions"] = list(transition.invalid_actions)
    obs_score = pred_score = None
    # a custom grader gets a truth of its own; ours share one per state (read-only)
    truth_of = grading_state if env.grades_descriptions else cached_grading_state
    if parsed.format_ok:
        try:
            if parsed.observation is not None:
                truth = truth_of(env, gt_before)
                obs_score = grade_for_env(env, parsed.observation, truth, rep)
            if parsed.prediction is not None:
                truth = truth_of(env, gt_after)
                pred_score = grade_for_env(env, parsed.prediction, truth, rep)
        except ValueError as exc:  # the state can't be graded in this representation
            obs_score = pred_score = None
            info["grading_error"] = f"{rep.value} descriptions of {env.name} can't be graded: {exc}"
    return TurnScore(
        format=cfg.format_reward if earned else 0.0,
        observation_score=obs_score,
        prediction_score=pred_score,
        world_model=world_model_reward(earned, obs_score, pred_score, cfg),
        info=info,
    )
