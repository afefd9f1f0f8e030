"""examples/learn_frozenlake.py --format: the oracle's scripted answers in every format
are valid there, and in grounding_worldmodeling its <observation> and <prediction> get the
server's full world-model scores, over a real server; the warm-up's data builder
(`oracle_demos`) lays those same texts out as the policy's answers."""

from __future__ import annotations

import re

import pytest

from clients import EnvClient
from clients.eval import train_level_seed
from examples import learn_frozenlake as lf
from trainer.model import load_policy
from trainer.trajectory import ChatLayout

SEEDS = [train_level_seed(7, i) for i in range(6)]
LAYOUTS = {
    "no_think": r"<answer>[^<]+</answer>",
    "free_think": r"<think>[^<]+</think><answer>[^<]+</answer>",
    "grounding_worldmodeling": r"<think><observation>[^<]+</observation><reasoning>[^<]+"
    r"</reasoning><prediction>[^<]+</prediction></think><answer>[^<]+</answer>",
}


@pytest.fixture(scope="module")
def layout(tiny_model_path):
    return ChatLayout(load_policy(tiny_model_path)[1])


@pytest.mark.parametrize(  # random moves where a fall's <prediction> is graded
    ("fmt", "choose"), [(f, "oracle") for f in lf.FORMATS] + [("grounding_worldmodeling", "random")]
)
def test_scripted_answers_are_valid_and_graded_full(visenv_server, layout, monkeypatch, fmt,
                                                    choose):  # fmt: skip
    monkeypatch.setattr(lf, "FORMAT", fmt)
    monkeypatch.setattr(lf, "PER_TURN", 2)  # answers of several moves: <prediction> after all
    policy = lf.oracle if choose == "oracle" else lf.random_policy(0)
    client = EnvClient(visenv_server.grpc)
    try:
        trajs = client.run_episodes(lf.ScriptedPolicy(policy), lf.ENV, SEEDS,
                                    config=lf.env_config("natural"),
                                    format=fmt, max_turns=lf.MAX_TURNS, progress=False)  # fmt: skip
        turns = [t for traj in trajs for t in traj.turns]
        assert turns and all(traj.ok for traj in trajs)
        for turn in turns:
            assert re.fullmatch(LAYOUTS[fmt], turn.response), turn.response
            assert turn.info["action_valid"] and not turn.info.get("parse_error"), turn.info
            assert turn.reward_parts.format == 0.5, (turn.response, turn.reward_parts)
            if fmt == "grounding_worldmodeling":  # the whole world-model reward: 1.0 each
                assert turn.info["observation_score"] == 1.0, (turn.response, turn.info)
                assert turn.info["prediction_score"] == 1.0, (turn.response, turn.info)
                parts = turn.reward_parts
                assert parts.observation == parts.prediction == 0.5, parts
            else:
                assert turn.info.get("observation_score") is None
        graded = lf.world_model_scores(trajs)
        assert graded == ({"observation_score": 1.0, "prediction_score": 1.0}
                          if fmt == "grounding_worldmodeling" else {})  # fmt: skip
        spread = lf.answer_spread(trajs)  # the move alone, whatever is said before it
        assert spread["distinct_first_moves"] == len({traj.turns[0].response.split("<answer>")[1]
                                                      for traj in trajs})  # fmt: skip
        if choose == "oracle":
            assert all(traj.success for traj in trajs)
        else:  # random moves fall into holes: the prediction of a fall is graded too
            assert any(traj.terminated and not traj.success for traj in trajs)

        # the warm-up's data: each episode's answers are the same texts, as tokens
        demos = lf.oracle_demos(client, layout, SEEDS, lf.env_config("natural"), policy)
        for demo, traj in zip(demos, trajs, strict=True):
            said = layout.tok.decode([t for t, m in zip(demo.input_ids, demo.loss_mask,
                                                        strict=True) if m])  # fmt: skip
            assert said == "".join(t.response + "<|im_end|>" for t in traj.turns)
        assert lf.answer_tokens(demos) == [
            len(layout.tok(t.response, add_special_tokens=False).input_ids)
            for traj in trajs for t in traj.turns
        ]  # fmt: skip
    finally:
        client.close_client()
