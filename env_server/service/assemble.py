"""A step's reward, assembled by one function wherever the step's reply is finished: in
the worker for most turns (`worker.Worker._step`), in the API process for a turn of a
session graded by the LLM judge, once the judge's scores are in (`rewards.Rewards.grade`),
which also subtracts the reasoning guard's penalty from a worker's reply (`with_penalty`)
in the rare turn that has one."""

from __future__ import annotations

import json
import math
from typing import Any

from env_server.reasoning import ReasoningConfig, TurnScore
from visenv.v1 import visenv_pb2 as pb

from .messages import Stepped
from .models import RewardParts, SessionReply


def assemble_reward(
    stepped: Stepped, score: TurnScore | None, cfg: ReasoningConfig, penalty: float = 0.0
) -> SessionReply:
    """The one place a step's reward is assembled: its parts, their sum and the score keys
    of its info, from the environment's reward (`stepped.env_reward`), the turn's
    reasoning score (the worker's rule-based one, or the LLM judge's; None for manual
    play) and the guard's `penalty`. Returns `stepped.reply`, filled in.

    Parts: env; format (the format reward earned); observation and prediction
    (beta_s * observation_score and beta_w * prediction_score, when the turn earned a
    world-model reward); penalty (-penalty). reward = their sum.
    """
    reply = stepped.reply
    parts = RewardParts(env=stepped.env_reward)
    if score is not None:
        parts.format = float(score.format)
        if score.world_model:
            parts.observation = float(cfg.beta_s * (score.observation_score or 0.0))
            parts.prediction = float(cfg.beta_w * (score.prediction_score or 0.0))
    if penalty:
        parts.penalty = -penalty
    reply.reward_parts = parts
    reply.reward = parts.total
    scores = {
        "observation_score": None if score is None else score.observation_score,
        "prediction_score": None if score is None else score.prediction_score,
        "judge_error": None if score is None else score.judge_error,
    }
    text = reply.json_text("info")  # the worker's info as JSON text, without SCORE_KEYS
    first = None if text is None else _scores_text(scores)
    if first is not None:  # the scores put in front of the worker's text
        reply.set_json_text("info", first if text == "{}" else f"{first[:-1]}, {text[1:]}")
    else:
        reply.info = {**scores, **reply.info}
    return reply


def with_penalty(reply: SessionReply, penalty: float) -> SessionReply:
    """A reply the worker finished (`assemble_reward` with no penalty), less the guard's
    `penalty`, as `assemble_reward` would have subtracted it (`RewardParts.total` adds
    the penalty last, to the sum of the others: the worker's reward). A reply still held
    as its wire form stays so: the two numbers are written over its bytes."""
    if not penalty:
        return reply
    data = reply.wire_bytes()
    if data is not None:
        reward = pb.SessionReply.FromString(data).reward + -penalty
        if reward:  # (a zero reward would not be written over the worker's)
            changes = pb.SessionReply(reward=reward, reward_parts=pb.RewardParts(penalty=-penalty))
            merged = reply.merged_wire(changes)
            if merged is not None:
                return merged
    reply.reward_parts.penalty = -penalty
    reply.reward = reply.reward_parts.total
    return reply


def _scores_text(scores: dict[str, Any]) -> str | None:
    """`json.dumps(scores)`, or None when a score is not finite (then they go as values)."""
    if any(isinstance(v, float) and not math.isfinite(v) for v in scores.values()):
        return None
    return json.dumps(scores)
