"""The model-free policies of `visenv eval --policy`: random moves and the env's own oracle.

Both answer in the `no_think` format (`<answer>...</answer>`, the actions separated by
", "), so an evaluation needs no model endpoint. The oracle plays each episode in a copy
of the environment of its own (the server's levels are deterministic under a seed, so the
copy is where the served session is): it answers `oracle_actions()` and steps its copy
with them, as the server steps the session.
"""

from __future__ import annotations

from typing import Any

from clients.rollout import PolicyInput
from trainer.levels import RandomPolicy

FORMAT = "no_think"  # what these policies write

__all__ = ["FORMAT", "OraclePolicy", "RandomPolicy", "action_text"]


def action_text(action: Any) -> str:
    """One action as an answer writes it: `Left`, `pick(10, -20, 30)`, or a document."""
    if action.payload is not None:
        return action.payload
    if action.args:
        return f"{action.name}({', '.join(f'{a:g}' for a in action.args)})"
    return action.name


class OraclePolicy:
    """The environment's own expert (BFS, planner, scripted skill, the right span)."""

    def __init__(self, env: str, config: dict[str, Any]) -> None:
        from env_server.core import registry

        self.cls = registry.load(env)
        self.config = self.cls.Config.model_validate(config)  # a bad config fails here, named
        self.copies: dict[int, Any] = {}  # episode -> its environment copy

    def __call__(self, batch: list[PolicyInput]) -> list[str]:
        out = []
        for p in batch:
            env = self.copies.get(p.episode)
            if env is None:
                env = self.copies[p.episode] = self.cls(self.config)
            if p.turn == 0:
                env.reset(p.seed)
            actions = env.oracle_actions()
            env.step(actions)
            out.append(f"<answer>{', '.join(action_text(a) for a in actions)}</answer>")
        live = {p.episode for p in batch}
        for episode in [e for e in self.copies if e not in live]:  # finished episodes
            self.copies.pop(episode).close()
        return out

    def close(self) -> None:
        for env in self.copies.values():
            env.close()
        self.copies.clear()
