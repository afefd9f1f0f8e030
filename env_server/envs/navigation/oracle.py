"""The expert of the navigation environment: a shortest path to the target.

The backend searches its own lattice of moves (`planner.py`: breadth-first search over
the same moves the agent makes, blocked where the agent would be) for the shortest plan
that ends within the success distance facing the target; the expert's next turn is the
start of that plan.
"""

from __future__ import annotations

from env_server.core import Action

from .backend import Backend


def oracle_actions(backend: Backend, target_id: str, actions_left: int) -> list[Action]:
    """The shortest plan's actions from the current pose ([] when none fits in
    `actions_left` actions); the caller keeps one turn's worth."""
    plan = backend.plan(target_id, max_len=max(actions_left, 1))
    return [Action(name) for name in plan or []]
