"""parse_natural's quick "no name here" check never hides a mention the regex would find."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from env_server.core.reading import _mention_pattern, parse_natural
from env_server.core.spatial import GradingSpec

TYPES = ("player", "box", "target", "wall", "red_ball")
SPEC = GradingSpec()
WORDS = ["box", "boxes", "Box", "BOXES", "target", "targets", "player", "I", "i", "me", "my",
         "you", "Your", "agent", "red ball", "red balls", "wall", "above", "below", "left",
         "of", "the", "is", "and", ",", ".", "\n", "#", "_", "P", "X", "O", "√", "-", "ox",
         "boxy", "mine", "1", "[2, 3]"]  # fmt: skip


def _check(text: str) -> None:
    names, mention, contained = _mention_pattern(TYPES, SPEC.ignore)
    assert contained is not None
    if text.isascii() and contained.search(text.lower()) is None:
        assert mention.search(text) is None, text


@settings(max_examples=400, deadline=None)
@given(st.lists(st.sampled_from(WORDS), max_size=12).map(" ".join))
def test_texts_of_words_the_regex_reads(text: str) -> None:
    _check(text)


@settings(max_examples=400, deadline=None)
@given(st.text(alphabet="abdegiklmnoprstxyABEGIKMOPRSTXY _\n#.,İıſK", max_size=40))
def test_any_letters_including_unicode_case_folds(text: str) -> None:
    _check(text)


def test_grids_and_sentences_read_as_before() -> None:
    grid = "######\n#_P__#\n#_X__#\n#__O_#\n######"
    assert parse_natural(grid, TYPES, SPEC) == []
    said = parse_natural("The box is below me. A target is left of the box.", TYPES, SPEC)
    assert [(r.subject, r.ref) for r in said] == [("box", "player"), ("target", "box")]
    # a name the regex finds only by Unicode case folding (a long s): not ASCII, read as before
    folded = parse_natural("The boxeſ are below me.", TYPES, SPEC)
    assert folded == parse_natural("The boxes are below me.", TYPES, SPEC) != []
