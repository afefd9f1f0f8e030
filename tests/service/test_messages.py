"""The worker protocol (env_server/service/messages.py) and the one place a step's reward
is assembled (assemble.assemble_reward), at the worker level: no processes."""

from __future__ import annotations

import dataclasses
import pickle

import pytest

from env_server.reasoning import ReasoningConfig, TurnScore
from env_server.service.assemble import assemble_reward
from env_server.service.messages import (
    Close,
    Create,
    Fork,
    Forked,
    Frame,
    ListEnv,
    Ready,
    Reset,
    Step,
    Stepped,
    Stop,
)
from env_server.service.models import ActionModel, RewardParts, ServiceError, SessionOptions
from env_server.service.worker import Worker


@pytest.mark.parametrize(
    "message",
    [
        ListEnv("sokoban"),
        Create("s-1", SessionOptions(env="sokoban", seed=3), ReasoningConfig()),
        Reset("s-1", 4, "raw"),
        Step("s-1", "<answer>Up</answer>"),
        Step("s-1", actions=[ActionModel(name="Up", args=[1.5], payload="p")]),
        Close("s-1"),
        Fork("s-1", ("s-2", "s-3")),
        Frame("s-1"),
        Stop(),
        Ready(123, {"sokoban": 0.5}),
        Forked(None),
    ],
)
def test_messages_pickle_to_equal_frozen_messages(message):
    again = pickle.loads(pickle.dumps(message, protocol=pickle.HIGHEST_PROTOCOL))
    assert again == message and type(again) is type(message)
    assert not hasattr(message, "__dict__")  # slotted
    for field in dataclasses.fields(message)[:1]:
        with pytest.raises(dataclasses.FrozenInstanceError):
            setattr(message, field.name, None)


def test_a_batch_is_answered_in_order_and_a_bad_item_fails_alone():
    worker = Worker()
    answers = worker.handle(
        [
            Create("s-1", SessionOptions(env="frozenlake", seed=1), ReasoningConfig()),
            ("create", "not a message"),
            Step("s-9", "<answer>Left</answer>"),  # no such session
            Step("s-1", actions=[ActionModel(name="left")]),  # the space spells it "Left"
            Close("s-1"),
        ]
    )
    made, bad, missing, stepped, closed = answers
    assert made.session_id == "s-1" and made.reward == 0.0
    assert isinstance(bad, ServiceError) and bad.code == "INTERNAL"
    assert isinstance(missing, ServiceError) and missing.code == "NOT_FOUND"
    assert isinstance(stepped, Stepped) and stepped.score is None  # manual play
    assert stepped.reply.info["actions"][0]["name"] == "Left"
    assert closed is None and not worker.sessions


def test_the_worker_finishes_a_step_reply_with_its_reward():
    """Without a judge the reply comes finished: the reward assembled from the worker's
    own score, as the API process would (its guard's penalty aside)."""
    worker = Worker()
    cfg = ReasoningConfig()
    options = SessionOptions(env="sokoban", seed=3, format="grounding_worldmodeling")
    worker.handle([Create("s-1", options, cfg)])
    grid = "######\n#_P__#\n#_X__#\n#__O_#\n#____#\n######"
    text = (f"<think><observation>{grid}</observation><reasoning>r</reasoning>"
            f"<prediction>{grid}</prediction></think><answer>Left</answer>")  # fmt: skip
    [stepped] = pickle.loads(pickle.dumps(worker.handle([Step("s-1", text)])))
    assert stepped.judge is None and stepped.score is not None
    parts, score = stepped.reply.reward_parts, stepped.score
    assert parts.env == stepped.env_reward and parts.format == float(score.format)
    assert parts.penalty == 0.0 and stepped.reply.reward == parts.total
    assert list(stepped.reply.info)[:3] == ["observation_score", "prediction_score", "judge_error"]
    assert stepped.reply.info["observation_score"] == score.observation_score


def test_the_reward_is_assembled_from_the_env_reward_the_score_and_the_penalty():
    worker = Worker()
    # judged: the worker leaves the reward to the API process (assembled once the judge's
    # scores are in; no judge is called here)
    judged = ReasoningConfig(
        grader="judge", judge={"base_url": "http://127.0.0.1:9/v1", "model": "m"}
    )
    worker.handle([Create("s-1", SessionOptions(env="frozenlake", seed=1), judged)])
    [stepped] = worker.handle([Step("s-1", "<answer>Left</answer>")])
    assert stepped.judge is not None and stepped.reply.reward_parts == RewardParts()
    cfg = ReasoningConfig(beta_s=0.5, beta_w=0.25)
    score = TurnScore(format=0.5, observation_score=1.0, prediction_score=0.4, world_model=0.6)
    reply = assemble_reward(stepped, score, cfg, penalty=0.1)
    parts = reply.reward_parts
    assert (parts.env, parts.format, parts.observation, parts.prediction, parts.penalty) == (
        stepped.env_reward, 0.5, 0.5, 0.1, -0.1
    )  # fmt: skip
    assert reply.reward == parts.total
    # the score keys come first in info, as before the assembly moved here
    assert list(reply.info)[:3] == ["observation_score", "prediction_score", "judge_error"]
    assert reply.info["observation_score"] == 1.0 and reply.info["prediction_score"] == 0.4
    # no world-model reward earned: no observation or prediction part, the scores still said
    unearned = TurnScore(format=0.0, observation_score=1.0, prediction_score=1.0, world_model=0.0)
    [stepped] = worker.handle([Step("s-1", "<answer>Left</answer>")])
    reply = assemble_reward(stepped, unearned, cfg)
    assert reply.reward_parts.observation == reply.reward_parts.prediction == 0.0
    assert reply.reward_parts.penalty == 0.0 and reply.info["observation_score"] == 1.0
