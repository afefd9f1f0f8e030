"""Rule-based grading of state descriptions (the `<observation>` and `<prediction>` text).

The truth is the environment's structured description of a state,
`json.loads(env.describe(state, STRUCTURED))` (see `grading_state`): a flat dict
from an object type to one position or a list of positions, e.g.

    {"player": [1, 2], "box": [[2, 3]], "target": [[4, 3]], "wall": [[0, 0], ...]}

Other values are graded as attributes: strings, numbers and lists of them
(navigation's `"direction": "left"`, `"distance": 2.5`); nested dicts are
flattened with dotted keys. Types in `GradingSpec.ignore` are never graded.

A description is read in the session's representation (structured JSON, a symbolic
grid, natural relation sentences) and scored as an F1 of its claims against the truth by
`core.reading`, the reading side of `core.spatial`'s vocabulary that environments write
with (its docstring has the rules).

This module adds what the reward needs around those readers: the truth of a state
(cached per state, with the items and relations derived from it, since one state is
graded against many texts), the environment's own grader where it has one, and the
check of a session's representation.

An environment whose states don't fit these readers overrides
`Environment.grade_description(text, truth, representation)` and it is used instead
(where it answers None, these readers grade the text with the environment's `grading`).
"""

from __future__ import annotations

import functools
import json
from typing import Any

from env_server.core import reading
from env_server.core.env import Environment
from env_server.core.reading import (
    Item,
    Relation,
    Value,
    f1,
    item_credit,
    matched_credit,
    normalize_key,
    parse_natural,
    parse_structured,
    parse_symbolic,
    relation,
    score_items,
    state_items,
)
from env_server.core.spatial import GradingSpec
from env_server.core.types import EnvError, Representation

__all__ = [
    # the readers and scores, from `core.reading`
    "Item",
    "Relation",
    "Value",
    "f1",
    "item_credit",
    "matched_credit",
    "normalize_key",
    "parse_natural",
    "parse_structured",
    "parse_symbolic",
    "relation",
    "score_items",
    "state_items",
    # grading with cached truths
    "GradedTruth",
    "cached_grading_state",
    "check_representation",
    "grade",
    "grade_for_env",
    "grade_natural",
    "grade_structured",
    "grade_symbolic",
    "grading_spec",
    "grading_state",
    "score_relations",
]

_canonical_keys = reading.canonical_keys  # the judge reads its extractions' keys with it


# ---- the truth ---------------------------------------------------------------


def grading_spec(env: Environment) -> GradingSpec:
    """The environment's declared `grading`, or the default spec where it declares None."""
    return env.grading if env.grading is not None else GradingSpec()


def grading_state(env: Environment, ground_truth: dict[str, Any]) -> dict[str, Any]:
    """The graded truth of a ground-truth dict: its structured description, parsed."""
    return json.loads(env.describe(ground_truth, Representation.STRUCTURED))


class GradedTruth(dict):
    """A graded truth (read-only by convention) that remembers what was derived from it:
    one state is graded against many texts, so its items and relations are worked out once."""

    __slots__ = ("memo",)

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.memo: dict[tuple, Any] = {}


@functools.lru_cache(maxsize=8192)
def _truth_of(description: str) -> GradedTruth:
    return GradedTruth(json.loads(description))


def cached_grading_state(env: Environment, ground_truth: dict[str, Any]) -> dict[str, Any]:
    """`grading_state`, shared between calls for equal states; the result must not be changed."""
    return _truth_of(env.describe(ground_truth, Representation.STRUCTURED))


def _derived(truth: dict[str, Any], key: tuple, compute):
    """`compute()`, remembered on a GradedTruth (computed each time on a plain dict)."""
    if not isinstance(truth, GradedTruth):
        return compute()
    if key not in truth.memo:
        truth.memo[key] = compute()
    return truth.memo[key]


def _truth_items(truth: dict[str, Any], spec: GradingSpec) -> list[Item]:
    return _derived(truth, ("items", spec.ignore), lambda: state_items(truth, spec))


def _truth_relations(truth: dict[str, Any], spec: GradingSpec) -> reading.TrueRelations:
    return _derived(
        truth,
        ("relations", spec.anchor, spec.tolerance, spec.ignore),
        lambda: reading.true_relations(truth, spec),
    )


# ---- the readers, with what they derive from the truth cached on a GradedTruth -----


def grade_structured(text: str, truth: dict[str, Any], spec: GradingSpec) -> float:
    return reading.grade_structured(text, truth, spec, _truth_items(truth, spec))


def grade_symbolic(text: str, truth: dict[str, Any], spec: GradingSpec) -> float:
    return reading.grade_symbolic(text, truth, spec, _truth_items(truth, spec))


def score_relations(claims: list[Relation], truth: dict[str, Any], spec: GradingSpec) -> float:
    """F1 of relation claims against the true relations of every object to the anchor."""
    return reading.score_relations(claims, truth, spec, _truth_relations(truth, spec))


def _natural_types(truth: dict[str, Any], spec: GradingSpec) -> tuple[str, ...]:
    symbols = tuple(spec.symbols.items())
    return _derived(
        truth,
        ("types", spec.anchor, spec.ignore, symbols),
        lambda: tuple(reading.natural_types(truth, spec)),
    )


def grade_natural(text: str, truth: dict[str, Any], spec: GradingSpec) -> float:
    return reading.grade_natural(
        text, truth, spec, _truth_relations(truth, spec), _natural_types(truth, spec)
    )


# ---- entry points ----------------------------------------------------------------


def grade(
    text: str, truth: dict[str, Any], spec: GradingSpec, representation: Representation | str
) -> float:
    """Score in [0, 1] of a description `text` of the state `truth` (structured dict)."""
    representation = Representation(representation)
    if representation is Representation.STRUCTURED:
        return grade_structured(text, truth, spec)
    if representation is Representation.SYMBOLIC:
        return grade_symbolic(text, truth, spec)
    return grade_natural(text, truth, spec)


def grade_for_env(
    env: Environment, text: str, truth: dict[str, Any], representation: Representation | str
) -> float:
    """`grade` with the environment's own grader where it has one (`grade_description`
    answering None hands the text to `grade`)."""
    representation = Representation(representation)
    if env.grades_descriptions:
        custom = env.grade_description(text, truth, representation)
        if custom is not None:
            score = float(custom)
            if not 0.0 <= score <= 1.0:
                raise ValueError(
                    f"{env.name}.grade_description returned {score}, not a score in [0, 1]"
                )
            return score
    return grade(text, truth, grading_spec(env), representation)


def check_representation(env: Environment, representation: Representation | str) -> None:
    """Refuse (EnvError INVALID_ARGUMENT) a representation the environment's descriptions
    cannot be graded in; the service calls it when a session is created."""
    try:
        representation = Representation(representation)
    except ValueError:
        names = ", ".join(r.value for r in Representation)
        raise EnvError(
            f"unknown representation {representation!r}; use one of {names}",
        ) from None
    if env.grades_descriptions:
        return
    if representation is Representation.SYMBOLIC and not grading_spec(env).symbols:
        raise EnvError(
            f"environment {env.name!r} has no symbolic grid to grade; "
            "use representation 'natural' or 'structured'"
        )
