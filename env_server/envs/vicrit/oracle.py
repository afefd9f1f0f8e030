"""Vicrit's expert: the item says which span was made wrong, so it answers with that span."""

from __future__ import annotations

from env_server.core import Action

from .data import Item


def answer(item: Item, action: str) -> list[Action]:
    """The one-action answer naming `item`'s wrong span (`action`: the answer's name)."""
    return [Action(name=action, payload=item.span)]
