"""Captions of our own scenes, one injected error, and the checks that keep both honest.

A scene is a level of a ground-truth environment (sokoban, frozenlake) at a seed. Its
caption is a list of `Sentence`s written from the environment's ground truth: a template
with slots ("The player is drawn as a small {} {}."), the words in each slot, and the set
of slot-word combinations that are *true* of the scene. Truth sets are worked out from
the environment's own structured description (`describe(state, "structured")`, the
truth `reasoning/` grades against) and its drawing conventions (colours and shapes of
its tiles).

Each slot belongs to an error category (object, attribute, count, spatial) or to none.
`corrupt` replaces the words of one slot of the drawn category so that:

- that sentence becomes false and every other sentence stays true;
- the new words (the span) occur exactly once in the whole caption, so the answer names
  one place;
- no other slot could be changed to make the caption true again: the corrupted caption
  has exactly one reading ("never ambiguous").

`verify` re-reads a caption *from its text* (the templates as regular expressions),
checks every sentence against the truth sets, and cross-checks the positions and
relations with the rule-based readers the world-model reward grades with (`core.reading`:
`score_items` on the positions and `grade_natural` on the relations score the clean
caption's claims 1.0 and a corrupted spatial claim below 1).
"""

from __future__ import annotations

import json
import re
import unicodedata
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, replace
from functools import cache, lru_cache
from typing import Any, Literal

import numpy as np

from env_server.core.env import Environment
from env_server.core.reading import grade_natural, score_items, state_items
from env_server.core.spatial import (
    HORIZONTAL,
    SAME_COLUMN,
    SAME_ROW,
    VERTICAL,
    GradingSpec,
    grid_relation,
    relation_phrase,
)
from env_server.core.types import Representation

Category = Literal["object", "attribute", "count", "spatial"]
CATEGORIES: tuple[Category, ...] = ("object", "attribute", "count", "spatial")

NUMBERS = (
    "no one two three four five six seven eight nine ten eleven twelve thirteen fourteen "
    "fifteen sixteen seventeen eighteen nineteen twenty"
).split()
ORDINALS = (
    "first second third fourth fifth sixth seventh eighth ninth tenth eleventh twelfth "
    "thirteenth fourteenth fifteenth sixteenth"
).split()
COLOURS = (
    "red", "orange", "yellow", "green", "blue", "purple", "pink", "white", "black", "grey",
    "brown", "light grey", "light blue", "dark blue", "dark green",
)  # fmt: skip
# what each thing in our scenes is drawn as, and the nouns an error may put in its place:
# things of the same kind that are in none of the scenes (subtle, not absurd), all
# consonant-initial so that "a {}" reads right whatever fills the slot
LOOKALIKES = {
    "crate": ("barrel", "basket", "bucket", "suitcase", "drum"),
    "ring": ("star", "triangle", "diamond", "square"),
    "figure": ("cat", "dog", "bird", "penguin", "snowman"),
    "flag": ("tent", "lamp", "tree", "cone", "sign"),
    "square": ("circle", "triangle", "star", "strip"),
}
NOUNS = tuple(dict.fromkeys([*LOOKALIKES, *(n for ns in LOOKALIKES.values() for n in ns)]))
RELATIONS = tuple(
    relation_phrase(v, h) for v in (*VERTICAL, SAME_ROW) for h in (*HORIZONTAL, SAME_COLUMN)
)
PLURALS = {"box": "boxes"}
MAX_COUNT = len(NUMBERS) - 1


def plural(noun: str) -> str:
    return PLURALS.get(noun, noun + "s")


def count_text(n: int, noun: str) -> str:
    """'no holes', 'one hole', 'three holes'."""
    return f"{NUMBERS[n]} {noun if n == 1 else plural(noun)}"


# ---- normalisation and scores -----------------------------------------------------------

_NON_WORD = re.compile(r"[\W_]+")


@lru_cache(maxsize=4096)
def normalize(text: str) -> str:
    """Case, punctuation and whitespace folded: 'Above and to the LEFT of!' -> 'above and
    to the left of'."""
    text = unicodedata.normalize("NFKC", text).casefold()
    return " ".join(_NON_WORD.sub(" ", text).split())


def tokens(text: str) -> list[str]:
    return normalize(text).split()


def exact_match(answer: str, span: str) -> bool:
    return normalize(answer) == normalize(span)


def token_f1(answer: str, span: str) -> float:
    """SQuAD-style token F1 of an answer against the span (both normalised)."""
    mine, gold = tokens(answer), tokens(span)
    if not mine or not gold:
        return float(mine == gold)
    common = sum((Counter(mine) & Counter(gold)).values())
    if common == 0:
        return 0.0
    precision, recall = common / len(mine), common / len(gold)
    return 2 * precision * recall / (precision + recall)


def occurrences(span: str, text: str) -> int:
    """How many times the span's normalised words occur as a run in the text's."""
    return _runs(normalize(span), normalize(text))


def _runs(needle: str, hay: str) -> int:
    """Occurrences of the words `needle` in the words `hay` (both normalised)."""
    if not needle:
        return 0
    needle, hay = f" {needle} ", f" {hay} "
    count, at = 0, hay.find(needle)
    while at >= 0:
        count += 1
        at = hay.find(needle, at + 1)
    return count


# ---- sentences ---------------------------------------------------------------------------


@dataclass(frozen=True)
class Slot:
    """One place in a sentence that can hold words: its error category (None: never
    corrupted) and its vocabulary (every text a reader could put there)."""

    category: Category | None
    vocabulary: tuple[str, ...]
    # texts a corruption may use (subtle ones: in range, same kind); default: vocabulary
    choices: tuple[str, ...] | None = None


@dataclass(frozen=True)
class Sentence:
    template: str  # with one "{}" per slot
    slots: tuple[Slot, ...]
    words: tuple[str, ...]  # what the slots hold
    truth: frozenset[tuple[str, ...]]  # every combination of slot words that is true
    fact: str = ""  # what the sentence is about (e.g. "position:hole"), for reports

    @property
    def text(self) -> str:
        return self.template.format(*self.words)

    @property
    def true(self) -> bool:
        return self.words in self.truth

    def with_word(self, index: int, word: str) -> Sentence:
        words = list(self.words)
        words[index] = word
        return replace(self, words=tuple(words))

    def fixes(self) -> set[int]:
        """The slots that could be changed (to a word of their vocabulary) to make this
        sentence true: one per reading of what is wrong in it."""
        found = set()
        for index, slot in enumerate(self.slots):
            head, tail = self.words[:index], self.words[index + 1 :]
            if any(head + (w,) + tail in self.truth for w in slot.vocabulary):
                found.add(index)
        return found


def sentence(
    template: str, slots: Sequence[Slot], truth: Iterable[tuple[str, ...]], fact: str = ""
) -> Sentence:
    """A true sentence: its words are the first true combination (in sorted order)."""
    truth = frozenset(truth)
    assert truth, f"no true words for {template!r}"
    return Sentence(template, tuple(slots), min(truth), truth, fact)


def plain_sentence(text: str) -> Sentence:
    return Sentence(text.replace("{", "{{").replace("}", "}}"), (), (), frozenset({()}))


@cache
def _counts(noun: str, limit: int = MAX_COUNT) -> tuple[str, ...]:
    return tuple(count_text(n, noun) for n in range(limit + 1))


def count_slot(noun: str, n: int) -> tuple[Slot, str]:
    """A count slot (subtle corruptions: one or two off) and its true text."""
    near = tuple(count_text(m, noun) for m in (n - 2, n - 1, n + 1, n + 2) if 0 <= m <= MAX_COUNT)
    return Slot("count", _counts(noun), near), count_text(n, noun)


def ordinal_slot(axis: str, index: int, lo: int, hi: int) -> Slot:
    """A row or column slot; errors move it one or two places, staying within lo..hi."""
    vocabulary = tuple(f"{o} {axis}" for o in ORDINALS)
    near = tuple(vocabulary[i] for i in range(index - 2, index + 3) if i != index and lo <= i <= hi)
    return Slot("spatial", vocabulary, near)


def noun_slot(noun: str) -> Slot:
    return Slot("object", NOUNS, LOOKALIKES[noun])


def relation_slot(vertical: str, horizontal: str) -> Slot:
    """A relation slot; an error changes one of its two axes (never to 'at the same position
    as': two things on one cell is a giveaway, not a subtle error)."""
    near = [relation_phrase(v, horizontal) for v in (*VERTICAL, SAME_ROW) if v != vertical]
    near += [relation_phrase(vertical, h) for h in (*HORIZONTAL, SAME_COLUMN) if h != horizontal]
    return Slot("spatial", RELATIONS, tuple(p for p in near if p != RELATIONS[-1]))


COLOUR = Slot("attribute", COLOURS)


# ---- scenes ----------------------------------------------------------------------------


@dataclass(frozen=True)
class Scene:
    """A level of a source environment: its ground truth and graded (structured) truth."""

    source: str
    seed: int
    ground_truth: dict[str, Any]
    truth: dict[str, Any]  # grading_state: {"player": [r, c], "box": [[r, c], ...], ...}
    spec: GradingSpec

    def cells(self, key: str) -> list[tuple[int, int]]:
        value = self.truth.get(key) or []
        if value and isinstance(value[0], int | float):
            value = [value]
        return [(int(r), int(c)) for r, c in value]

    @property
    def size(self) -> tuple[int, int]:
        rows, cols = self.ground_truth["grid_size"]
        return int(rows), int(cols)


def _position_sentences(scene: Scene, key: str, verb: str, margin: int = 0) -> list[Sentence]:
    """'The box is in the third row and the fourth column.' (one per instance); an error
    keeps the position `margin` cells away from the edge (off Sokoban's outer wall)."""
    rows, cols = scene.size
    cells = scene.cells(key)
    truth = {(f"{ORDINALS[r]} row", f"{ORDINALS[c]} column") for r, c in cells}
    article = "The" if len(cells) == 1 else "A"
    out = []
    for r, c in cells:
        slots = (
            ordinal_slot("row", r, margin, rows - 1 - margin),
            ordinal_slot("column", c, margin, cols - 1 - margin),
        )
        s = sentence(f"{article} {key} {verb} in the {{}} and the {{}}.", slots, truth,
                     f"position:{key}")  # fmt: skip
        out.append(replace(s, words=(f"{ORDINALS[r]} row", f"{ORDINALS[c]} column")))
    return out


def _relation_sentences(scene: Scene, key: str) -> list[Sentence]:
    """'The hole is above and to the right of the player.' (one per instance), in
    `core.spatial`'s words, which the environment's natural-language grader reads."""
    anchor = scene.cells(scene.spec.anchor)[0]
    cells = scene.cells(key)
    axes = [grid_relation(anchor, cell) for cell in cells]
    truth = {(relation_phrase(*a),) for a in axes}
    article = "The" if len(cells) == 1 else "A"
    anchor_name = scene.spec.anchor
    return [
        replace(
            sentence(
                f"{article} {key} is {{}} the {anchor_name}.",
                (relation_slot(*a),),
                truth,
                f"relation:{key}",
            ),  # fmt: skip
            words=(relation_phrase(*a),),
        )
        for a in axes
    ]


def _grid_sentence(scene: Scene, what: str) -> Sentence:
    rows, cols = scene.size
    row_slot, row_text = count_slot("row", rows)
    col_slot, col_text = count_slot("column", cols)
    return sentence(
        f"This is a top-down picture of {what}, a grid of {{}} and {{}}.",
        (row_slot, col_slot),
        {(row_text, col_text)},
        "grid",
    )


_COUNTING = plain_sentence("Rows are counted from the top and columns from the left.")


def sokoban_sentences(scene: Scene) -> list[Sentence]:
    """The caption of a Sokoban room (colours and shapes as `sokoban/render.py` draws)."""
    gt = scene.ground_truth
    rows, cols = scene.size
    walls = {tuple(w) for w in gt["walls"]}
    inner = [w for w in walls if 0 < w[0] < rows - 1 and 0 < w[1] < cols - 1]
    boxes, targets = scene.cells("box"), scene.cells("target")
    on_target = [b for b in boxes if b in set(targets)]
    off_target = [b for b in boxes if b not in set(targets)]
    free_targets = [t for t in targets if t not in set(boxes)]
    wall_slot, wall_text = count_slot("wall block", len(inner))
    cell_slot, cell_text = count_slot("cell", rows * cols - len(walls))
    box_slot, box_text = count_slot("box", len(boxes))
    target_slot, target_text = count_slot("target", len(targets))
    out = [
        _grid_sentence(scene, "a Sokoban room"),
        _COUNTING,
        sentence("An outer wall of {} bricks runs all around the room.", (COLOUR,),
                 {("brown",)}, "colour:wall"),
        sentence("Inside the outer wall the room holds {}.", (wall_slot,), {(wall_text,)},
                 "count:wall"),
        sentence("The floor is {}, and {} of the room are not wall.", (COLOUR, cell_slot),
                 {("light grey", cell_text)}, "floor"),
        sentence("The room contains {} and {}.", (box_slot, target_slot),
                 {(box_text, target_text)}, "count:box,target"),
    ]  # fmt: skip
    crate = (noun_slot("crate"), COLOUR)
    if off_target:
        out.append(sentence(
            "Each box that is not on a target is drawn as a wooden {} with a cross on it, "
            "coloured {}.", crate, {("crate", "orange")}, "look:box"))  # fmt: skip
    if on_target:
        out.append(sentence(
            "Each box that sits on a target is drawn as a wooden {} with a cross on it, "
            "coloured {}.", crate, {("crate", "green")}, "look:box"))  # fmt: skip
    if free_targets:
        out.append(sentence("Each target is marked on the floor by a {} painted {}.",
                            (noun_slot("ring"), COLOUR), {("ring", "red")},
                            "look:target"))  # fmt: skip
    out.append(sentence("The player is drawn as a small {} {}.", (COLOUR, noun_slot("figure")),
                        {("blue", "figure")}, "look:player"))  # fmt: skip
    out += _position_sentences(scene, "player", "stands", margin=1)
    out += _position_sentences(scene, "box", "is", margin=1)
    out += _position_sentences(scene, "target", "is", margin=1)
    out += _relation_sentences(scene, "box")
    out += _relation_sentences(scene, "target")
    return out


def frozenlake_sentences(scene: Scene) -> list[Sentence]:
    """The caption of a FrozenLake map (as gymnasium's FrozenLake-v1 draws it)."""
    rows, cols = scene.size
    holes = scene.cells("hole")
    hole_slot, hole_text = count_slot("hole", len(holes))
    ice_slot, ice_text = count_slot("cell", rows * cols - len(holes) - 1)
    out = [
        _grid_sentence(scene, "a frozen lake"),
        _COUNTING,
        sentence("The ice is {}, and the lake has {} in it.", (COLOUR, hole_slot),
                 {("light blue", hole_text)}, "ice"),
    ]  # fmt: skip
    if holes:
        out.append(sentence("Each hole is a {} of {} water.", (noun_slot("square"), COLOUR),
                            {("square", "dark blue")}, "look:hole"))  # fmt: skip
    out += [
        sentence("Apart from the goal and the holes, {} are plain ice.", (ice_slot,),
                 {(ice_text,)}, "count:ice"),
        sentence("The goal is marked by a small {} coloured {}.", (noun_slot("flag"), COLOUR),
                 {("flag", "red")}, "look:goal"),
        sentence("The player is drawn as a little {}.", (noun_slot("figure"),), {("figure",)},
                 "look:player"),
        plain_sentence("The player starts on the cell marked with the letter S, and the goal "
                       "cell is marked with the letter G."),
    ]  # fmt: skip
    out += _position_sentences(scene, "player", "stands")
    out += _position_sentences(scene, "goal", "is")
    out += _position_sentences(scene, "hole", "is")
    out += _relation_sentences(scene, "goal")
    out += _relation_sentences(scene, "hole")
    return out


WRITERS = {"sokoban": sokoban_sentences, "frozenlake": frozenlake_sentences}


def text_of(sentences: Sequence[Sentence]) -> str:
    return " ".join(s.text for s in sentences)


# ---- the injected error ------------------------------------------------------------------


@dataclass(frozen=True)
class Corruption:
    sentence: int  # index in the caption's sentences
    slot: int
    original: str  # the true words
    span: str  # the words that replaced them
    category: Category


def candidates(sentences: Sequence[Sentence], category: Category) -> list[Corruption]:
    """Every unambiguous corruption of `category` (see the module docstring)."""
    clean = normalize(text_of(sentences))
    out = []
    for i, s in enumerate(sentences):
        for j, slot in enumerate(s.slots):
            if slot.category != category:
                continue
            for word in slot.choices or slot.vocabulary:
                if word == s.words[j] or _runs(normalize(word), clean) > 0:
                    continue  # the same words, or words that already occur in the caption
                bad = s.with_word(j, word)
                if bad.true or bad.fixes() != {j}:
                    continue  # still true, or a second reading of what is wrong
                # the word is nowhere else, so only a run across this sentence's edges
                # could repeat it: look at the sentence and its neighbours
                around = text_of([*sentences[max(i - 1, 0) : i], bad, *sentences[i + 1 : i + 2]])
                if occurrences(word, around) != 1:
                    continue  # the span runs across a sentence boundary or repeats
                out.append(Corruption(i, j, s.words[j], word, category))
    return out


def apply(sentences: Sequence[Sentence], c: Corruption) -> list[Sentence]:
    out = list(sentences)
    out[c.sentence] = out[c.sentence].with_word(c.slot, c.span)
    return out


def choose(
    sentences: Sequence[Sentence], category: Category, rng: np.random.Generator
) -> Corruption | None:
    found = candidates(sentences, category)
    return found[int(rng.integers(len(found)))] if found else None


# ---- verification (from the text) ------------------------------------------------------


class CaptionError(AssertionError):
    """A caption that is not what it claims to be (a bug in its writer)."""


@lru_cache(maxsize=256)
def _pattern(template: str, vocabularies: tuple[tuple[str, ...], ...]) -> re.Pattern[str]:
    """A sentence template as a regular expression: each slot any word of its vocabulary."""
    parts = template.split("{}")
    body = re.escape(parts[0].replace("{{", "{").replace("}}", "}"))
    for vocabulary, literal in zip(vocabularies, parts[1:], strict=True):
        options = sorted(vocabulary, key=len, reverse=True)
        body += "(" + "|".join(re.escape(o) for o in options) + ")"
        body += re.escape(literal.replace("{{", "{").replace("}}", "}"))
    return re.compile(body)


def read(text: str, templates: Sequence[Sentence]) -> list[Sentence]:
    """The caption `text` read back with the scene's templates: each sentence's slot words
    come from the text, its truth set from the scene."""
    out, pos = [], 0
    for template in templates:
        vocabularies = tuple(slot.vocabulary for slot in template.slots)
        match = _pattern(template.template, vocabularies).match(text, pos)
        if match is None:
            raise CaptionError(f"caption does not follow {template.template!r} at {pos}")
        out.append(replace(template, words=match.groups()))
        pos = match.end()
        if text[pos : pos + 1] == " ":
            pos += 1
    if pos != len(text):
        raise CaptionError(f"unread text at the end of the caption: {text[pos:]!r}")
    return out


def _graded_claims(scene: Scene, sentences: Sequence[Sentence]) -> tuple[dict, str]:
    """The positions (as a structured claim) and relation sentences the caption states."""
    positions: dict[str, list[list[int]]] = {}
    relations = []
    for s in sentences:
        kind, _, key = s.fact.partition(":")
        if kind == "position":
            row, col = (ORDINALS.index(w.split()[0]) for w in s.words)
            positions.setdefault(key, []).append([row, col])
        elif kind == "relation":
            relations.append(s.text)
    return positions, " ".join(relations)


def verify(
    scene: Scene,
    text: str,
    *,
    span: str | None = None,
    category: Category | None = None,
    original: str | None = None,
) -> None:
    """Raise CaptionError unless `text` is a true caption of the scene (span None) or one
    with exactly one error, at `span`, of `category`, whose one reading is `original`."""
    templates = WRITERS[scene.source](scene)
    sentences = read(text, templates)
    false = [i for i, s in enumerate(sentences) if not s.true]
    positions, relation_text = _graded_claims(scene, sentences)
    truth, spec = scene.truth, scene.spec
    structured = score_items(
        state_items(positions, spec), state_items({k: truth[k] for k in positions}, spec), spec
    )
    natural = grade_natural(relation_text, truth, spec) if relation_text else 1.0
    if span is None:
        if false:
            raise CaptionError(f"false sentence(s) in a clean caption: {false}")
        if structured != 1.0 or natural != 1.0:
            raise CaptionError(f"the grader scores the positions {structured}, relations {natural}")
        return
    if len(false) != 1:
        raise CaptionError(f"{len(false)} false sentences; expected exactly one")
    bad = sentences[false[0]]
    where = [j for j, w in enumerate(bad.words) if normalize(w) == normalize(span)]
    if len(where) != 1 or bad.fixes() != {where[0]}:
        raise CaptionError(f"span {span!r} is not the one reading of {bad.text!r}")
    if bad.slots[where[0]].category != category:
        raise CaptionError(f"span {span!r} is a {bad.slots[where[0]].category} error")
    if occurrences(span, text) != 1:
        raise CaptionError(f"span {span!r} occurs {occurrences(span, text)} times")
    if original is not None and not bad.with_word(where[0], original).true:
        raise CaptionError(f"{original!r} does not make {bad.text!r} true")
    if category == "spatial" and bad.fact.startswith("relation") and natural >= 1.0:
        raise CaptionError("the grader does not see the corrupted relation")
    if category == "spatial" and bad.fact.startswith("position") and structured >= 1.0:
        raise CaptionError("the grader does not see the corrupted position")


def make_scene(source: str, env: Environment, ground_truth: dict[str, Any], seed: int) -> Scene:
    return Scene(
        source=source,
        seed=seed,
        ground_truth=ground_truth,
        truth=json.loads(env.describe(ground_truth, Representation.STRUCTURED)),
        spec=env.grading if env.grading is not None else GradingSpec(),
    )
