"""The format guard, `ppo.invalid_answer_penalty`: taken off the reward of exactly the
turns whose answer the server found invalid, and so off the episode's reward (what
GRPO and the StarPO-S filter rank by); the episode goes on. Over a real server, with
answers the server judges, not flags written by the test."""

from __future__ import annotations

import pytest

from clients import EnvClient
from clients.eval import train_level_seed
from examples import learn_frozenlake as lf
from trainer.config import ConfigError, load_config
from trainer.model import load_policy
from trainer.ppo import train
from trainer.rollout import collect
from trainer.trajectory import ChatLayout, EpisodeTokens

FMT = "grounding_worldmodeling"
SEEDS = [train_level_seed(3, i) for i in range(4)]
MAX_TURNS = 3


def _half_broken(inp) -> str:
    """The oracle's valid answer, but on odd levels' first turn cut off before </answer>
    (an answer that ran out of tokens)."""
    text = lf.respond(lf.oracle(inp), inp.observation.ground_truth, FMT)
    return text[: -len("</answer>")] if inp.turn == 0 and inp.seed % 2 else text


class _Policy:
    """Answers `_half_broken` and lays each episode out as the policy's tokens."""

    def __init__(self, layout: ChatLayout) -> None:
        self.layout, self.episodes = layout, {}

    def __call__(self, batch):
        texts = []
        for inp in batch:
            ep = self.episodes.setdefault(inp.episode, EpisodeTokens())
            if inp.turn == 0:
                self.layout.system(ep, inp.system_prompt)
            self.layout.user(ep, inp.observation.text, [])
            text = _half_broken(inp)
            ids = self.layout.tok(text, add_special_tokens=False).input_ids
            self.layout.response(ep, ids + [self.layout.im_end_id])
            texts.append(text)
        return texts


def _collect(server, layout, penalty):
    client = EnvClient(server.grpc)
    try:
        return collect(client, lambda: _Policy(layout), lf.ENV, SEEDS,
                       invalid_penalty=penalty, config=lf.env_config("natural") | {"p": 1.0,
                       "max_turns": MAX_TURNS}, format=FMT, max_turns=MAX_TURNS)  # fmt: skip
    finally:
        client.close_client()


@pytest.fixture(scope="module")
def layout(tiny_model_path):
    return ChatLayout(load_policy(tiny_model_path)[1])


def test_penalty_lands_exactly_on_invalid_answers(visenv_server, layout, monkeypatch):
    monkeypatch.setattr(lf, "FORMAT", FMT)
    monkeypatch.setattr(lf, "PER_TURN", 1)  # one move a turn
    plain, guarded = _collect(visenv_server, layout, 0.0), _collect(visenv_server, layout, 2.0)
    by_seed = {t.seed: t for t in plain.trajectories}
    invalid_seen = valid_seen = 0
    for ep, traj in zip(guarded.episodes, guarded.trajectories, strict=True):
        base = by_seed[traj.seed]
        assert [t.response for t in traj.turns] == [t.response for t in base.turns]
        n_invalid = 0
        for turn, reward in zip(traj.turns, ep.turn_rewards, strict=True):
            if turn.info["action_valid"]:
                assert reward == turn.reward
                valid_seen += 1
            else:  # the server refused it (no </answer>), and the episode went on
                assert "parse_error" in turn.info and len(traj.turns) > 1
                assert reward == pytest.approx(turn.reward - 2.0)
                n_invalid += 1
        assert ep.info["invalid_penalty"] == pytest.approx(2.0 * n_invalid)
        assert ep.info["reward"] == pytest.approx(traj.total_reward - 2.0 * n_invalid)
        invalid_seen += n_invalid
    assert invalid_seen and valid_seen  # both kinds of turn were played
    for ep in plain.episodes:  # off: the server's rewards as they are
        assert "invalid_penalty" not in ep.info
        assert ep.turn_rewards == [t.reward for t in by_seed[ep.info["seed"]].turns]


def test_ppo_applies_the_configured_penalty(visenv_server, tiny_model_path, tmp_path):
    """train() takes the penalty off the rewards it learns from: a random tiny model's
    answers are all invalid, so the episode's reward drops by the penalty per turn."""

    def run(penalty, out):
        cfg = load_config(None, [
            f"env.servers=['{visenv_server.grpc}']", "env.name=frozenlake", f"env.format={FMT}",
            "env.max_turns=2", 'env.config={"render_mode": "text"}', f"model.path='{tiny_model_path}'", "model.critic=head",
            "generation.max_new_tokens=6", "ppo.iterations=1", "ppo.episodes_per_iteration=2",
            "ppo.minibatch_size=2", f"ppo.invalid_answer_penalty={penalty}",
            f"run.out_dir='{out}'", "run.progress=false", "run.threads=1",
        ])  # fmt: skip
        return train(cfg).history[0]

    off, on = run(0.0, tmp_path / "off"), run(1.5, tmp_path / "on")
    assert off["action_valid"] == on["action_valid"] == 0.0  # the same sampled answers
    assert "invalid_penalty" not in off
    assert on["invalid_penalty"] == pytest.approx(1.5 * on["turns"])
    assert on["reward"] == pytest.approx(off["reward"] - 1.5 * on["turns"])


def test_negative_penalty_is_refused():
    with pytest.raises(ConfigError, match="ppo.invalid_answer_penalty"):
        load_config(None, ["env.servers=['a:1']", "model.path=m", "ppo.invalid_answer_penalty=-1"])
