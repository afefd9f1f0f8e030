"""The expert of the SVG environment: it answers with the target icon's own SVG source,
which renders to the target exactly (score 1.0)."""

from __future__ import annotations

from env_server.core import Action, ActionSpace


def oracle_actions(space: ActionSpace, target_svg: str) -> list[Action]:
    """The one answer that reproduces the target: its own source."""
    return [Action(name=space.names[0], payload=target_svg)]
