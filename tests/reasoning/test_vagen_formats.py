"""VAGEN main's formats (vagen_*): found where they are, as VAGEN main's parsers do.

The layouts and rules are those of github.com/mll-lab-nu/VAGEN (branch main, commit
2936322a), vagen/envs/{sokoban,frozenlake,navigation,primitive_skill}/utils. That the
verdicts equal VAGEN main's own parsers' on a corpus is tests_compat/test_vagen_main.py.
"""

import pytest

from env_server.core import registry
from env_server.core.types import Action, ActionKind, ActionSpace, ResponseFormat
from env_server.reasoning import ReasoningConfig, parse_response, score_turn, system_prompt

F = ResponseFormat
GRID = ActionSpace(ActionKind.DISCRETE, ("Up", "Down", "Left", "Right"), max_per_turn=3)
ARM = ActionSpace(
    ActionKind.CALL, ("pick", "place", "push"), max_per_turn=2,
    arity={"pick": 3, "place": 3, "push": 6},
)  # fmt: skip
WM = "<observation>o</observation>\n<think>t</think>\n<answer>{}</answer>\n<prediction>p</prediction>"


def names(p):
    return [a.name for a in p.actions]


def test_wm_is_vagen_mains_layout_not_the_papers():
    assert names(parse_response(WM.format("Left, up"), F.VAGEN_WM, GRID)) == ["Left", "Up"]
    paper = "<think><observation>o</observation><reasoning>r</reasoning><prediction>p</prediction></think><answer>Left</answer>"
    refused = parse_response(paper, F.VAGEN_WM, GRID)
    assert not refused.format_ok and "<observation>...</observation><think>" in refused.error
    assert not parse_response(WM.format("Left"), F.GROUNDING_WORLDMODELING, GRID).format_ok


def test_text_around_is_ignored_and_extra_actions_are_dropped_as_vagen_main_does():
    p = parse_response("Sure!\n" + WM.format("Left, Up, Down, Right, Left") + "\nDone.",
                       F.VAGEN_WM, GRID)  # fmt: skip
    assert p.format_ok and names(p) == ["Left", "Up", "Down"]  # max_per_turn 3: the first 3
    assert (p.observation, p.reasoning, p.prediction) == ("o", "t", "p")
    empty_items = parse_response("<think>x</think><answer>,Up,,</answer>", F.VAGEN_FREE_THINK, GRID)
    assert names(empty_items) == ["Up"]


@pytest.mark.parametrize(
    "fmt, text, why",
    [
        (F.VAGEN_WM, WM.format(""), "empty <answer>"),
        (F.VAGEN_WM, WM.format("Jump"), "unknown action 'Jump'"),
        (F.VAGEN_WM, WM.format("Up").replace("\n<think>", " so <think>"), "no <observation>"),
        (F.VAGEN_FREE_THINK, "<THINK>x</THINK><answer>Up</answer>", "no <think>"),
        (F.VAGEN_NO_THINK, "ok <answer>Up</answer>", "no <answer>"),
        (F.VAGEN_FREE_WM, "<answer>Up</answer><prediction>p</prediction>", "no <observation>"),
    ],
)
def test_what_vagen_main_rejects_is_rejected(fmt, text, why):
    p = parse_response(text, fmt, GRID)
    assert not p.format_ok and p.actions == [] and why in p.error


def test_answer_tag_and_separator_are_the_sessions():
    nav = ReasoningConfig(answer_tag="action", action_sep="|")
    text = "<think>t</think><action>Up | Left</action>"
    assert names(parse_response(text, F.VAGEN_FREE_THINK, GRID, nav)) == ["Up", "Left"]
    assert not parse_response(text, F.VAGEN_FREE_THINK, GRID).format_ok  # <answer> by default
    calls = "<think>t</think><answer>pick(1, 2, 3)|place(4,5,6)</answer>"
    p = parse_response(calls, F.VAGEN_FREE_THINK, ARM, ReasoningConfig(action_sep="|"))
    assert p.actions == [Action("pick", (1, 2, 3)), Action("place", (4, 5, 6))]
    # the paper's formats take the separator too
    strict = parse_response("<answer>Up | Down</answer>", F.NO_THINK, GRID, nav)
    assert names(strict) == ["Up", "Down"]
    with pytest.raises(ValueError):
        ReasoningConfig(action_sep="<")


def test_world_model_reward_grades_vagen_wm_like_the_papers_format():
    env = registry.make("sokoban")
    env.reset(7)
    before = env.ground_truth()
    actions = env.oracle_actions()
    probe = registry.make("sokoban")
    probe.reset(7)
    seen = probe.describe(probe.ground_truth(), "natural")
    transition = probe.step(actions)
    after = probe.describe(probe.ground_truth(), "natural")
    answer = ", ".join(a.name for a in actions)
    text = f"<observation>{seen}</observation><think>go</think><answer>{answer}</answer><prediction>{after}</prediction>"
    parsed = parse_response(text, F.VAGEN_WM, env.action_space)
    env_tr = env.step(parsed.actions)
    score = score_turn(env, parsed, env_tr, before, env_tr.observation.ground_truth,
                       F.VAGEN_WM, "natural", ReasoningConfig())  # fmt: skip
    assert score.observation_score == 1.0 and score.prediction_score == 1.0
    assert score.world_model == 1.0 and score.format == 0.5
    assert transition.observation.ground_truth == env_tr.observation.ground_truth


@pytest.mark.parametrize("fmt", [f for f in F if f.value.startswith("vagen_")])
def test_the_prompts_example_parses_in_its_own_format(fmt):
    env = registry.make("sokoban")
    env.reset(1)
    cfg = ReasoningConfig(action_sep="|", answer_tag="action")
    prompt = system_prompt(env, fmt, "natural", cfg)
    example = prompt.split("Example response:\n", 1)[1]
    assert parse_response(example, fmt, env.action_space, cfg).format_ok, example
    assert "Example response" not in system_prompt(env, fmt, "natural",
                                                   ReasoningConfig(prompt_example=False))  # fmt: skip


def test_vagen_formats_take_vagen_mains_spellings_only_where_it_has_its_own():
    nav = ActionSpace(ActionKind.DISCRETE, ("moveahead", "rotateleft"), max_per_turn=5,
                      vagen_names={"move_forward": "moveahead", "turn_left": "rotateleft"})  # fmt: skip
    theirs = "<think>t</think><answer>Move_Forward, turn_left</answer>"
    assert names(parse_response(theirs, F.VAGEN_FREE_THINK, nav)) == ["moveahead", "rotateleft"]
    ours = parse_response("<think>t</think><answer>moveahead</answer>", F.VAGEN_FREE_THINK, nav)
    assert not ours.format_ok and "move_forward, turn_left" in ours.error  # as VAGEN main
    both = "<think>t</think><answer>moveahead, turn_left</answer>"
    assert names(parse_response(both, F.FREE_THINK, nav)) == ["moveahead", "rotateleft"]
    assert nav.vagen_name("rotateleft") == "turn_left" and GRID.vagen_name("Up") == "Up"
