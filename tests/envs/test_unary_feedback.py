"""UFO's unary feedback (envs/_feedback.py) as an option of vicrit and svg."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from env_server.core import Action, EnvError, registry
from env_server.envs._feedback import Attempts, FeedbackConfig

SVG = '<svg xmlns="http://www.w3.org/2000/svg" viewBox="0 0 72 72">{}</svg>'
NOT_IT = SVG.format('<rect x="60" y="60" width="5" height="5" fill="#0f0"/>')


def _vicrit(**config):
    env = registry.make("vicrit", {"feedback": "unary", **config})
    env.reset(9)
    return env, env.ground_truth()["span"]


def _answer(text: str) -> list[Action]:
    return [Action("span", payload=text)]


def test_attempts_record_decay_and_repeats() -> None:
    cfg = FeedbackConfig(feedback="unary", max_attempts=3, reward_decay=0.5, repeat_penalty=0.3)
    assert cfg.max_turns == 3  # the episode length follows max_attempts
    log = Attempts()
    first = log.record(cfg, key="a", correct=False, base_reward=0.0)
    again = log.record(cfg, key="a", correct=False, base_reward=0.0)
    last = log.record(cfg, key="b", correct=True, base_reward=1.0)
    assert (first.reward, first.repeated, first.done) == (0.0, False, False)
    assert (again.reward, again.repeated, again.info()["attempts_left"]) == (-0.3, True, 1)
    assert (last.reward, last.correct, last.truncated, last.number) == (0.25, True, False, 3)
    plain = FeedbackConfig(max_turns=2)  # without unary feedback: the base reward as it is
    assert Attempts().record(plain, key=None, correct=True, base_reward=0.7).reward == 0.7


def test_vicrit_wrong_then_right() -> None:
    env, span = _vicrit()
    wrong = env.step(_answer("nothing like it"))
    assert wrong.observation.text == "Let's try again." and wrong.observation.images == []
    assert not wrong.done and wrong.reward == 0.0 and wrong.info["attempt"] == 1
    right = env.step(_answer(span))
    assert right.success and right.terminated and not right.truncated
    assert right.reward == pytest.approx(0.8) and right.info["attempt"] == 2
    assert not right.info["repeated"]


def test_vicrit_correct_first_answer_earns_full_reward() -> None:
    env, span = _vicrit(max_attempts=5)
    tr = env.step(_answer(span))
    assert tr.reward == 1.0 and tr.success and tr.info["attempt"] == 1
    assert tr.info["attempts_left"] == 0 and env.oracle_actions() == []


def test_vicrit_repeated_answer_is_penalised_after_normalisation() -> None:
    env, span = _vicrit(repeat_penalty=0.5, feedback_phrase="Try again, please.")
    assert env.step(_answer("Purple barrel")).info["repeated"] is False
    tr = env.step(_answer("  purple BARREL! "))
    assert tr.info["repeated"] and tr.reward == -0.5
    assert tr.observation.text == "Try again, please."
    assert "Try again, please." in env.system_prompt("no_think")


def test_vicrit_attempt_limit_ends_the_episode() -> None:
    env, _ = _vicrit(max_attempts=2)
    assert not env.step(_answer("one")).done
    tr = env.step(_answer("two"))
    assert tr.truncated and not tr.terminated and not tr.success and tr.info["attempts_left"] == 0
    assert tr.observation.text == "Let's try again."
    with pytest.raises(EnvError, match="ended"):
        env.step(_answer("three"))


def test_config_keeps_max_turns_equal_to_max_attempts() -> None:
    assert registry.make_config("vicrit", {"feedback": "unary", "max_attempts": 4}).max_turns == 4
    assert registry.make_config("svg", {"feedback": "unary"}).max_turns == 3
    assert registry.make_config("svg", {}).max_turns == 2  # svg's own default, unchanged
    with pytest.raises(ValidationError) as exc:
        registry.make_config("svg", {"feedback": "unary", "max_attempts": 4, "max_turns": 2})
    assert exc.value.errors()[0]["loc"] == ("max_attempts",)
    with pytest.raises(ValidationError):
        registry.make_config("vicrit", {"feedback": "often"})


@pytest.fixture(scope="module")
def svg_env():
    env = registry.make("svg", {"feedback": "unary", "max_attempts": 3, "reward_decay": 0.5})
    yield env
    env.close()


def test_svg_wrong_then_right_and_repeat(svg_env) -> None:
    svg_env.reset(3)
    wrong = svg_env.step([Action("svg", payload=NOT_IT)])
    assert wrong.observation.text == "Let's try again." and wrong.observation.images == []
    assert not wrong.done and wrong.info["attempt"] == 1 and wrong.info["score"] < 0.9
    repeat = svg_env.step([Action("svg", payload=NOT_IT.replace("><", ">\n  <"))])
    assert repeat.info["repeated"]
    assert repeat.reward == pytest.approx(wrong.info["score"] * 0.5 - 0.2)
    right = svg_env.step(svg_env.oracle_actions())
    assert right.success and right.terminated and right.reward == pytest.approx(0.25)
    assert right.info["attempt"] == 3 and len(right.observation.images) == 2
    assert "You have 3 attempt(s)" in svg_env.system_prompt("no_think")


def test_svg_attempt_limit(svg_env) -> None:
    svg_env.reset(4)
    for n in range(3):
        tr = svg_env.step([Action("svg", payload=NOT_IT.replace("#0f0", f"#00{n}"))])
    assert tr.truncated and not tr.success and tr.info["attempts_left"] == 0
    assert tr.observation.text == "Let's try again."


def test_the_example_training_config_loads_and_its_env_config_is_valid() -> None:
    from trainer.config import load_config

    cfg = load_config("examples/train_vicrit_unary.yaml")
    assert cfg.env.name == "vicrit"
    env_cfg = registry.make_config(cfg.env.name, cfg.env.config)
    assert env_cfg.feedback == "unary" and env_cfg.max_turns == cfg.env.max_turns == 3
