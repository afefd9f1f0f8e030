"""Format reward and world-model reward of whole turns, on the real Sokoban and FrozenLake."""

import json
import pickle

import pytest

from env_server.core import registry
from env_server.core.env import Environment
from env_server.core.spatial import GradingSpec
from env_server.core.types import (
    Action,
    ActionKind,
    ActionSpace,
    EnvError,
    Observation,
    Representation,
    ResponseFormat,
    Transition,
)
from env_server.reasoning import (
    JudgeItem,
    ReasoningConfig,
    check_representation,
    grade_for_env,
    grading_state,
    parse_response,
    score_turn,
    system_prompt,
    turn_prompt,
)
from env_server.reasoning.formats import layout

F, R = ResponseFormat, Representation
ENVS = ["sokoban", "frozenlake"]


def response(fmt, obs=None, pred=None, answer="Up"):
    sections = {"observation": obs, "reasoning": "I plan my moves.", "prediction": pred}
    inner = "".join(f"<{n}>{t}</{n}>" for n, t in sections.items() if f"<{n}>" in layout(fmt))
    think = "" if fmt is F.NO_THINK else f"<think>{inner or 'I plan.'}</think>"
    return f"{think}<answer>{answer}</answer>"


def play_turn(name, seed, rep, describe_after=True, cfg=None):
    """One oracle turn; the agent describes the states exactly (or repeats the old one)."""
    env = registry.make(name)
    env.reset(seed=seed)
    actions = env.oracle_actions()
    gt0 = env.ground_truth()
    answer = ", ".join(a.name for a in actions)
    # predict by playing the oracle moves on a copy
    snap = env.snapshot()
    env.step(actions)
    gt_pred = env.ground_truth()
    env.restore(snap)
    pred_state = gt_pred if describe_after else gt0
    fmt = F.GROUNDING_WORLDMODELING
    text = response(fmt, env.describe(gt0, rep), env.describe(pred_state, rep), answer)
    parsed = parse_response(text, fmt, env.action_space)
    assert parsed.format_ok, parsed.error
    tr = env.step(parsed.actions)
    gt1 = env.ground_truth()
    return env, score_turn(env, parsed, tr, gt0, gt1, fmt, rep, cfg or ReasoningConfig()), gt0, gt1


@pytest.mark.parametrize("name", ENVS)
@pytest.mark.parametrize("rep", list(R))
def test_exact_descriptions_earn_the_full_reward(name, rep):
    _, score, _, _ = play_turn(name, seed=5, rep=rep)
    assert score.format == 0.5
    assert score.observation_score == pytest.approx(1.0)
    assert score.prediction_score == pytest.approx(1.0)
    assert score.world_model == pytest.approx(1.0)
    assert score.total == pytest.approx(1.5)
    assert score.judge_error is None


@pytest.mark.parametrize("name", ENVS)
def test_prediction_is_graded_against_the_state_after_the_step(name):
    env, score, gt0, gt1 = play_turn(name, seed=5, rep=R.STRUCTURED, describe_after=False)
    assert grading_state(env, gt0) != grading_state(env, gt1)  # the oracle moved the player
    assert score.observation_score == pytest.approx(1.0)
    assert score.prediction_score < 1.0
    assert score.world_model == pytest.approx(0.5 + 0.5 * score.prediction_score)


def test_betas_and_format_reward_are_configurable():
    cfg = ReasoningConfig(format_reward=1.0, beta_s=0.2, beta_w=0.0)
    _, score, _, _ = play_turn("sokoban", seed=2, rep=R.NATURAL, cfg=cfg)
    assert score.format == 1.0
    assert score.world_model == pytest.approx(0.2)


def test_malformed_response_earns_nothing_and_says_why():
    env = registry.make("sokoban")
    env.reset(seed=1)
    gt0 = env.ground_truth()
    parsed = parse_response("<answer>Up</answer> thanks", F.NO_THINK, env.action_space)
    tr = env.step(parsed.actions)
    score = score_turn(
        env, parsed, tr, gt0, env.ground_truth(), F.NO_THINK, R.NATURAL, ReasoningConfig()
    )
    assert score.format == 0.0 and score.world_model == 0.0
    assert score.observation_score is None and score.prediction_score is None
    assert "extra text" in score.info["parse_error"]


def test_actions_refused_by_the_env_withhold_the_rewards_but_scores_are_reported():
    env = registry.make("frozenlake")
    env.reset(seed=1)
    gt0 = env.ground_truth()
    text = response(F.GROUNDING, obs=env.describe(gt0, R.NATURAL), answer="Down")
    parsed = parse_response(text, F.GROUNDING, env.action_space)
    assert parsed.format_ok
    # the same turn as the env saw it, with an action it refused (e.g. sent by another path)
    tr = env.step([*parsed.actions, Action("Teleport")])
    assert tr.invalid_actions
    score = score_turn(
        env, parsed, tr, gt0, env.ground_truth(), F.GROUNDING, R.NATURAL, ReasoningConfig()
    )
    assert score.format == 0.0 and score.world_model == 0.0
    assert score.observation_score == pytest.approx(1.0)
    assert score.prediction_score is None
    assert score.info["refused_actions"] == tr.invalid_actions


@pytest.mark.parametrize("fmt", [F.NO_THINK, F.FREE_THINK])
def test_formats_without_descriptions_earn_only_the_format_reward(fmt):
    env = registry.make("sokoban")
    env.reset(seed=3)
    gt0 = env.ground_truth()
    answer = ", ".join(a.name for a in env.oracle_actions())
    parsed = parse_response(response(fmt, answer=answer), fmt, env.action_space)
    tr = env.step(parsed.actions)
    score = score_turn(env, parsed, tr, gt0, env.ground_truth(), fmt, R.NATURAL, ReasoningConfig())
    assert score.format == 0.5 and score.world_model == 0.0
    assert score.observation_score is None and score.prediction_score is None


def test_config_is_strict():
    with pytest.raises(ValueError):
        ReasoningConfig.model_validate({"format_rewrd": 1})
    with pytest.raises(ValueError, match="needs a 'judge'"):
        ReasoningConfig(grader="judge")
    with pytest.raises(ValueError, match="top_k"):
        ReasoningConfig.model_validate({"guard": {"top_k": 10, "window": 5}})


@pytest.mark.parametrize("name", ENVS)
@pytest.mark.parametrize("fmt", list(F))
@pytest.mark.parametrize("rep", list(R))
def test_the_system_prompt_example_parses_and_follows_the_representation(name, fmt, rep):
    env = registry.make(name)
    obs = env.reset(seed=0)
    prompt = system_prompt(env, fmt, rep)
    assert prompt.startswith(env.system_prompt(fmt).strip())
    assert layout(fmt) in prompt
    example = prompt.split("Example response:\n", 1)[1]
    parsed = parse_response(example, fmt, env.action_space)
    assert parsed.format_ok, parsed.error
    if parsed.observation is not None:
        # the example is written in the session's representation, and its state is made up
        gt = env.ground_truth()
        assert parsed.observation != env.describe(gt, rep)
        if rep is R.STRUCTURED:
            assert parsed.observation.startswith("{")
        elif rep is R.SYMBOLIC:
            assert "\n" in parsed.observation and "P" in parsed.observation
        else:
            assert "of the player" in parsed.observation
    reminder = turn_prompt(env, obs, fmt, rep)
    assert reminder.startswith(obs.text) and layout(fmt) in reminder


class Beacon(Environment):
    """A minimal continuous environment: one beacon on a line, no anchor, no symbols."""

    name = "beacon"
    grading = GradingSpec(anchor="agent", tolerance=0.5, ignore=())

    @classmethod
    def action_space_for(cls, config):
        return ActionSpace(ActionKind.CALL, ("go",), max_per_turn=1, arity={"go": 1})

    def _reset(self, seed):
        self.x = float(seed % 7)
        return Observation("beacon", [], self.ground_truth())

    def _apply(self, actions):
        self.x -= actions[0].args[0]
        return Transition(
            Observation("beacon", [], self.ground_truth()), 0.0, False, False, False, 1
        )

    def ground_truth(self):
        return {"beacon": [self.x, 0.0]}

    def describe(self, state, representation):
        return json.dumps(state)

    def system_prompt(self, format):
        return "Walk to the beacon."

    def _oracle(self):
        return [Action("go", (self.x,))]


def test_check_representation_refuses_what_cannot_be_graded():
    sokoban = registry.make("sokoban")
    for rep in R:
        check_representation(sokoban, rep)
    with pytest.raises(EnvError, match="no symbolic grid") as exc:
        check_representation(Beacon(), "symbolic")
    assert exc.value.code == "INVALID_ARGUMENT"
    with pytest.raises(EnvError, match="unknown representation"):
        check_representation(sokoban, "emoji")


def test_ungradable_state_is_reported_not_hidden():
    env = Beacon()
    env.reset(seed=3)
    gt0 = env.ground_truth()
    text = "<think><observation>The beacon is ahead of me.</observation><reasoning>go</reasoning></think><answer>go(3)</answer>"
    parsed = parse_response(text, F.GROUNDING, env.action_space)
    tr = env.step(parsed.actions)
    score = score_turn(
        env, parsed, tr, gt0, env.ground_truth(), F.GROUNDING, R.NATURAL, ReasoningConfig()
    )
    assert score.observation_score is None and score.world_model == 0.0
    assert "no position for the anchor 'agent'" in score.info["grading_error"]
    # structured descriptions of the same env are graded with its tolerance
    text = text.replace("The beacon is ahead of me.", '{"beacon": [3.3, 0]}')
    env.reset(seed=3)
    parsed = parse_response(text, F.GROUNDING, env.action_space)
    tr = env.step(parsed.actions)
    score = score_turn(
        env, parsed, tr, gt0, env.ground_truth(), F.GROUNDING, R.STRUCTURED, ReasoningConfig()
    )
    assert score.observation_score == 1.0 and score.world_model == 0.5


def test_an_env_can_bring_its_own_grader():
    class Graded(Beacon):
        def grade_description(self, text, truth, representation):
            return 1.0 if "ahead" in text and truth["beacon"][0] > 0 else 0.0

    env = Graded()
    env.reset(seed=3)
    truth = grading_state(env, env.ground_truth())
    assert grade_for_env(env, "The beacon is ahead of me.", truth, R.NATURAL) == 1.0
    assert grade_for_env(env, "It is behind me.", truth, R.NATURAL) == 0.0
    check_representation(env, R.SYMBOLIC)  # its own grader decides
    assert env.grades_descriptions and not Beacon().grades_descriptions


def test_a_grader_answering_none_hands_the_text_to_the_generic_one():
    class Partly(Beacon):
        def grade_description(self, text, truth, representation):
            return None if representation is R.STRUCTURED else 0.25

    env = Partly()
    env.reset(seed=3)
    truth = grading_state(env, env.ground_truth())
    assert grade_for_env(env, '{"beacon": [3.3, 0]}', truth, R.STRUCTURED) == 1.0  # tolerance
    assert grade_for_env(env, "anything", truth, R.NATURAL) == 0.25


def test_guard_score_of_a_turn():
    _, score, _, _ = play_turn("sokoban", seed=5, rep=R.NATURAL)
    assert score.guard_score == 1.0
    score.observation_score, score.prediction_score = 0.2, None
    assert score.guard_score == 0.2
    score.observation_score = None
    assert score.guard_score == 1.0
    score.format = 0.0
    assert score.guard_score == 0.0


def test_judge_items_cross_process_boundaries():
    env = registry.make("sokoban")
    env.reset(seed=1)
    gt = env.ground_truth()
    text = f"<think><observation>{env.describe(gt, R.NATURAL)}</observation><reasoning>r</reasoning></think><answer>Up</answer>"
    parsed = parse_response(text, F.GROUNDING, env.action_space)
    tr = env.step(parsed.actions)
    cfg = ReasoningConfig(grader="judge", judge={"base_url": "http://127.0.0.1:9/v1", "model": "m"})
    rule = score_turn(env, parsed, tr, gt, env.ground_truth(), F.GROUNDING, R.NATURAL, cfg)
    item = JudgeItem.build(env, parsed, gt, env.ground_truth(), R.NATURAL, cfg, rule)
    again = pickle.loads(pickle.dumps(item))
    assert again == item and again.truth_before == grading_state(env, gt)
    assert again.observation == parsed.observation and again.prediction is None
