"""Strict parsing of the five response formats and of the three action kinds."""

import pytest

from env_server.core.types import Action, ActionKind, ActionSpace, ResponseFormat
from env_server.reasoning import layout, parse_response

F = ResponseFormat
GRID = ActionSpace(ActionKind.DISCRETE, ("Up", "Down", "Left", "Right"), max_per_turn=3)
ARM = ActionSpace(
    ActionKind.CALL,
    ("pick", "place", "push"),
    max_per_turn=2,
    arity={"pick": 3, "place": 3, "push": 6},
)
SVG = ActionSpace(ActionKind.DOCUMENT, ("svg",), max_per_turn=1)

OBS, RSN, PRED = (
    "<observation>The box is below me.</observation>",
    "<reasoning>Push it down.</reasoning>",
    "<prediction>The box is on the target.</prediction>",
)
GOOD = {
    F.NO_THINK: "<answer>Up, Left</answer>",
    F.FREE_THINK: "<think>I go up then left.</think><answer>Up, Left</answer>",
    F.GROUNDING: f"<think>{OBS}{RSN}</think><answer>Up, Left</answer>",
    F.WORLDMODELING: f"<think>{RSN}{PRED}</think><answer>Up, Left</answer>",
    F.GROUNDING_WORLDMODELING: f"<think>{OBS}{RSN}{PRED}</think><answer>Up, Left</answer>",
    F.VAGEN_FREE_THINK: "<think>I go up then left.</think><answer>Up, Left</answer>",
    F.VAGEN_WM: f"{OBS}<think>Push it down.</think><answer>Up, Left</answer>{PRED}",
    F.VAGEN_FREE_WM: f"{OBS} Push it down. <answer>Up, Left</answer> then {PRED}",
    F.VAGEN_NO_THINK: "<answer>Up, Left</answer>",
    F.VAGEN_EVAL_MODE: "I go up then left. <answer>Up, Left</answer>",
}


@pytest.mark.parametrize("fmt", list(F))
def test_well_formed_in_every_format(fmt):
    p = parse_response(GOOD[fmt], fmt, GRID)
    assert p.format_ok and p.error is None
    assert p.actions == [Action("Up"), Action("Left")]
    assert p.answer == "Up, Left"
    sections = {"observation": p.observation, "reasoning": p.reasoning, "prediction": p.prediction}
    for name, value in sections.items():
        if name == "reasoning" and fmt.value.startswith("vagen_"):  # their <think> is it
            continue
        assert (value is not None) == (f"<{name}>" in layout(fmt))
    if fmt in (F.GROUNDING_WORLDMODELING, F.VAGEN_WM, F.VAGEN_FREE_WM):
        assert p.observation == "The box is below me."
        assert p.prediction == "The box is on the target."
    if fmt in (F.FREE_THINK, F.VAGEN_FREE_THINK):
        assert p.think == "I go up then left."


def test_whitespace_between_tags_and_case_of_names_are_fine():
    text = "\n <think>\n <observation> a </observation>\n<reasoning>b</reasoning>\n</think>\n<answer> up ,LEFT\n</answer>\n"
    p = parse_response(text, F.GROUNDING, GRID)
    assert p.format_ok, p.error
    assert [a.name for a in p.actions] == ["Up", "Left"]


@pytest.mark.parametrize(
    "fmt, text, expected",
    [
        (F.GROUNDING, f"<think>{RSN}</think><answer>Up</answer>", "missing <observation>"),
        (F.FREE_THINK, "<answer>Up</answer>", "missing <think>"),
        (F.NO_THINK, "<think>x</think><answer>Up</answer>", "unexpected <think>"),
        (
            F.GROUNDING,
            f"<think>{OBS}{RSN}{PRED}</think><answer>Up</answer>",
            "unexpected <prediction>",
        ),
        (F.GROUNDING, f"<think>{RSN}{OBS}</think><answer>Up</answer>", "out of order"),
        (F.FREE_THINK, "<answer>Up</answer><think>x</think>", "out of order"),
        (F.NO_THINK, "Sure! <answer>Up</answer>", "extra text before <answer>"),
        (F.NO_THINK, "<answer>Up</answer> done", "extra text after </answer>"),
        (
            F.GROUNDING,
            f"<think>{OBS} so {RSN}</think><answer>Up</answer>",
            "extra text before <reasoning>",
        ),
        (F.NO_THINK, "<answer>Up</answer><answer>Down</answer>", "appears 2 times"),
        (F.NO_THINK, "<answer>Up", "missing </answer>"),
        (F.NO_THINK, "<answer>  </answer>", "empty <answer>"),
        (
            F.GROUNDING,
            f"<think><observation> </observation>{RSN}</think><answer>Up</answer>",
            "empty <observation>",
        ),
        (F.FREE_THINK, "<think></think><answer>Up</answer>", "empty <think>"),
        (F.NO_THINK, "Up, Left", "missing <answer>"),
    ],
)
def test_malformed_layouts(fmt, text, expected):
    p = parse_response(text, fmt, GRID)
    assert not p.format_ok
    assert p.actions == []
    assert expected in p.error


def test_sections_are_still_reported_when_the_answer_is_invalid():
    p = parse_response(GOOD[F.GROUNDING].replace("Up, Left", "Jump"), F.GROUNDING, GRID)
    assert not p.format_ok and p.actions == []
    assert "unknown action 'Jump'" in p.error
    assert p.observation == "The box is below me."


@pytest.mark.parametrize(
    "answer, expected",
    [
        ("Up, Up, Up, Left", "4 actions given; at most 3"),
        ("Up, Fly", "unknown action 'Fly'"),
        ("Up,, Left", "empty action"),
        ("Up,", "empty action"),
        ("Up Left", "unknown action 'Up Left'"),
    ],
)
def test_discrete_action_errors(answer, expected):
    p = parse_response(f"<answer>{answer}</answer>", F.NO_THINK, GRID)
    assert not p.format_ok and expected in p.error


def test_discrete_actions_at_the_limit():
    p = parse_response("<answer>down, DOWN, Right</answer>", F.NO_THINK, GRID)
    assert p.format_ok and [a.name for a in p.actions] == ["Down", "Down", "Right"]


def test_call_actions():
    p = parse_response("<answer>pick(10, 20, 30), Place(-1.5, 2e1, 0)</answer>", F.NO_THINK, ARM)
    assert p.format_ok, p.error
    assert p.actions == [Action("pick", (10.0, 20.0, 30.0)), Action("place", (-1.5, 20.0, 0.0))]
    p = parse_response("<answer>push(1, 2, 3, 4, 5, 6)</answer>", F.NO_THINK, ARM)
    assert p.actions[0].args == (1, 2, 3, 4, 5, 6)


@pytest.mark.parametrize(
    "answer, expected",
    [
        ("pick(10, 20)", "pick takes 3 arguments, got 2"),
        ("push(1, 2, 3)", "push takes 6 arguments, got 3"),
        ("pick(1, 2, x)", "argument 'x' of pick is not a number"),
        ("pick(1, 2, nan)", "not a finite number"),
        ("grab(1, 2, 3)", "unknown action 'grab'"),
        ("pick 1 2 3", "not a call"),
        ("pick(1, 2, 3", "unbalanced"),
        ("pick(1,2,3), pick(1,2,3), pick(1,2,3)", "3 actions given; at most 2"),
    ],
)
def test_call_action_errors(answer, expected):
    p = parse_response(f"<answer>{answer}</answer>", F.NO_THINK, ARM)
    assert not p.format_ok and expected in p.error


SVG_DOC = '<svg xmlns="http://www.w3.org/2000/svg" width="4" height="4"><rect width="4" height="4" fill="red"/></svg>'


@pytest.mark.parametrize(
    "answer",
    [SVG_DOC, f"\n{SVG_DOC}\n", f"```svg\n{SVG_DOC}\n```", f"```\n{SVG_DOC}\n```"],
)
def test_document_answer_with_or_without_fence(answer):
    p = parse_response(
        f"<think>draw a red square</think><answer>{answer}</answer>", F.FREE_THINK, SVG
    )
    assert p.format_ok, p.error
    assert p.actions == [Action("svg", payload=SVG_DOC)]


def test_empty_document_is_invalid():
    p = parse_response("<answer>```svg\n```</answer>", F.NO_THINK, SVG)
    assert not p.format_ok and "empty" in p.error


def test_unknown_format_name_is_refused():
    with pytest.raises(ValueError):
        parse_response("<answer>Up</answer>", "chain_of_thought", GRID)
