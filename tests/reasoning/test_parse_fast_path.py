"""The layout check's one-match fast path gives exactly what the tag walk gives.

`_split_sections` takes a well-formed response apart with one match of the format's
pattern and leaves everything else to `_walk_sections` (the check before issue 28);
here both run on generated responses (tag soups, well-formed responses with a tag
dropped, doubled, moved or misspelled, whitespace of every kind, case, stray text and
nesting) and must agree on the sections and the error, for every paper format.
"""

from __future__ import annotations

from unittest.mock import patch

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from env_server.core.types import ActionKind, ActionSpace, ResponseFormat
from env_server.reasoning import formats
from env_server.reasoning.formats import SECTIONS, TAG_NAMES, _split_sections, _walk_sections

PAPER = list(SECTIONS)
# whitespace, ASCII and not: the walk's \s and str.strip take all, the pattern only ASCII's
SPACES = st.sampled_from(
    ["", " ", "\n", "\t", "\r\n", "\x0b\x0c", "\xa0", "\u2003", "\x1c", "  \n "]
)
TEXT = st.sampled_from(
    ["", "Up", "Left, Up", "x", "<", ">", "</", "<b>", "a<answer", "answer>", "<think", "\xa0"]
) | st.text(alphabet="<>/ atnswerhikobv\n", max_size=12)


def spelled(name: str) -> st.SearchStrategy[str]:
    """`name` in some case, or with a look-alike the walk's case-insensitive match takes
    (the Kelvin sign for k, the long s for s)."""
    odd = {"k": "\u212a", "s": "\u017f"}
    return st.lists(st.sampled_from([0, 1, 2]), min_size=len(name), max_size=len(name)).map(
        lambda picks: "".join(
            c.upper() if p == 1 else odd.get(c, c) if p == 2 else c
            for c, p in zip(name, picks, strict=True)
        )
    )


@st.composite
def tag(draw, name: str | None = None, close: bool | None = None) -> str:
    name = name or draw(st.sampled_from(TAG_NAMES + ("b", "thought")))
    close = draw(st.booleans()) if close is None else close
    odd = draw(st.integers(0, 9)) == 0
    written = draw(spelled(name)) if odd else name
    inside = draw(SPACES) if odd else ""
    return f"<{'/' if close else ''}{written}{inside}>"


@st.composite
def well_formed(draw, fmt: ResponseFormat) -> list[str]:
    """The pieces of a response in `fmt`: tags, contents and the gaps between them."""
    sections = SECTIONS[fmt]

    def section(name: str) -> list[str]:
        return [draw(tag(name, False)), draw(TEXT), draw(tag(name, True)), draw(SPACES)]

    pieces = [draw(SPACES)]
    if sections is None:
        pieces += section("think")
    elif sections:
        pieces += [draw(tag("think", False)), draw(SPACES)]
        for name in sections:
            pieces += section(name)
        pieces += [draw(tag("think", True)), draw(SPACES)]
    return pieces + section("answer")


@st.composite
def mutated(draw, fmt: ResponseFormat) -> str:
    pieces = draw(well_formed(fmt))
    for _ in range(draw(st.integers(0, 2))):
        i = draw(st.integers(0, len(pieces) - 1))
        how = draw(st.sampled_from(["drop", "double", "move", "insert_text", "insert_tag", "nest"]))
        if how == "drop":
            pieces.pop(i)
        elif how == "double":
            pieces.insert(i, pieces[i])
        elif how == "move":
            pieces.insert(draw(st.integers(0, len(pieces) - 1)), pieces.pop(i))
        elif how == "insert_text":
            pieces.insert(i, draw(TEXT))
        elif how == "insert_tag":
            pieces.insert(i, draw(tag()))
        else:  # a section inside another one
            pieces.insert(i, "".join(draw(well_formed(draw(st.sampled_from(PAPER))))))
        if not pieces:
            break
    return "".join(pieces)


SOUP = st.lists(tag() | TEXT | SPACES, max_size=14).map("".join)


@pytest.mark.parametrize("fmt", PAPER, ids=lambda f: f.value)
@settings(max_examples=600, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_fast_path_agrees_with_the_tag_walk(fmt: ResponseFormat, data) -> None:
    text = data.draw(st.one_of(well_formed(fmt).map("".join), mutated(fmt), SOUP))
    assert _split_sections(text, fmt) == _walk_sections(text, fmt)


@pytest.mark.parametrize("fmt", PAPER, ids=lambda f: f.value)
@settings(max_examples=200, deadline=None)
@given(data=st.data())
def test_well_formed_responses_take_the_fast_path(fmt: ResponseFormat, data) -> None:
    """A well-formed response with ASCII spacing never walks its tags (so the agreement
    above is between two different pieces of code)."""
    text = "".join(data.draw(well_formed(fmt)))
    sections, error = _walk_sections(text, fmt)
    if error is None and text.isascii() and not set(text) & set("\x1c\x1d\x1e\x1f"):
        with patch.object(formats, "_walk_sections", _refuse):
            assert _split_sections(text, fmt) == (sections, None)


def _refuse(text: str, fmt: ResponseFormat):
    raise AssertionError(f"walked the tags of a well-formed {fmt.value} response: {text!r}")


GRID = ActionSpace(ActionKind.DISCRETE, ("Up", "Down", "Left", "Right"), max_per_turn=3)
ARM = ActionSpace(ActionKind.CALL, ("pick", "place"), max_per_turn=2, arity={"pick": 3, "place": 3})
ANSWER = st.text(alphabet="UpLeft,;() []x1. \n", max_size=20)


@settings(max_examples=600, deadline=None)
@given(answer=ANSWER, sep=st.sampled_from([",", ";", "||", " ", "(,", "]"]))
def test_split_top_level_agrees_with_the_character_walk(answer: str, sep: str) -> None:
    assert formats._split_top_level(answer, sep) == formats._walk_top_level(answer, sep)
