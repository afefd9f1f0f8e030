"""core.types' format and representation enums: converting a member is free, the rest is Enum's."""

from __future__ import annotations

import pickle

import pytest

from env_server.core.types import Representation, ResponseFormat


@pytest.mark.parametrize("kind", [Representation, ResponseFormat])
def test_members_strings_and_bad_values_convert_as_enum_does(kind) -> None:
    for member in kind:
        assert kind(member) is member
        assert kind(member.value) is member
        assert kind[member.name] is member
        assert pickle.loads(pickle.dumps(member)) is member
    with pytest.raises(ValueError, match="is not a valid"):
        kind("no_such_value")
    with pytest.raises(ValueError, match="is not a valid"):
        kind(Representation.NATURAL if kind is ResponseFormat else ResponseFormat.NO_THINK)
