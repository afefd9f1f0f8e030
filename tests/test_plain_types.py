"""core.types.plain: replies as plain JSON types, the place of a bad value named."""

from __future__ import annotations

import enum
import re

import numpy as np
import pytest

from env_server.core.types import plain


class Colour(enum.IntEnum):
    RED = 1


def test_numpy_values_tuples_sets_and_keys_become_plain() -> None:
    value = {
        "a": (1, np.int64(2)),
        3: {np.int64(4): {2, 1}},
        "b": np.arange(3),
        "c": [np.float32(0.5), Colour.RED, None, True],
    }
    out = plain(value)
    assert out == {"a": [1, 2], "3": {"4": [1, 2]}, "b": [0, 1, 2], "c": [0.5, 1, None, True]}
    assert [type(x) for x in out["c"]] == [float, int, type(None), bool]
    assert list(out) == ["a", "3", "b", "c"]  # order kept


def test_what_is_plain_already_is_returned_as_it_is() -> None:
    truth = {"player": [1, 2], "walls": [[0, 0], [0, 1]], "name": "x", "n": 1.5}
    assert plain(truth) is truth
    mixed = {"ok": [[0, 0]], "later": [np.int64(1)]}
    out = plain(mixed)
    assert out is not mixed and out["ok"] is mixed["ok"] and type(out["later"][0]) is int


@pytest.mark.parametrize(
    ("value", "where"),
    [
        ({"cubes": [1, {"pose": object()}]}, "ground_truth.cubes[1].pose: object"),
        ({"a": {(1, 2): 3}}, "ground_truth.a: key (1, 2) of type tuple"),
        ([1, {1, b"x"}], "ground_truth[1][]: bytes"),
    ],
)
def test_a_bad_value_is_named_where_it_sits(value, where) -> None:
    with pytest.raises(TypeError, match="^" + re.escape(where)):
        plain(value, "ground_truth")


def test_lists_of_positions_are_checked_to_the_last_value() -> None:
    """A list of lists of scalars (a room's walls) is checked in one pass; a value inside
    one that is not plain still gets converted, or named."""
    walls = [[0, 0], [0, 1], [1, 0]]
    assert plain(walls) is walls
    nested = [[0], [[1, 2]], []]
    assert plain(nested) is nested
    out = plain([[0, 0], [np.int64(1), 2]])
    assert out == [[0, 0], [1, 2]] and type(out[1][0]) is int
    assert plain([[0], (1, 2)]) == [[0], [1, 2]]
    with pytest.raises(TypeError, match=re.escape("walls[1][0]: object")):
        plain([[0, 0], [object(), 1]], "walls")
