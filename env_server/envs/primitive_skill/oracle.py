"""The scripted expert of primitive_skill: per task, the primitives that finish it.

From the objects' positions (metres, world) and what the gripper holds, each task's
script lists pick / place / push primitives in integer millimetres; the environment
plays its first turn's worth, and the script is asked again from the new state. The
contract suite and `bench/bench_primitive_skill.py` check that it solves every seed.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from env_server.core import Action

from .tasks import (
    CABINET_FRONT_Y,
    CUBE_HALF,
    DRAWER_CLOSED_BELOW,
    TRAY_DEPTH,
    WALL,
    AlignTwoCube,
    PlaceTwoCube,
    PutAppleInDrawer,
    StackThreeCube,
    Task,
)

Positions = dict[str, np.ndarray]


@dataclass(frozen=True)
class Plan:
    """One oracle primitive: name and integer-millimetre arguments."""

    name: str
    args: tuple[int, ...]


def oracle_actions(task: Task, pos: Positions, held: str | None) -> list[Action]:
    """The expert's primitives that finish `task` from this state, as actions."""
    return [Action(p.name, tuple(float(a) for a in p.args)) for p in plan(task, pos, held)]


def plan(task: Task, pos: Positions, held: str | None) -> list[Plan]:
    """Scripted primitives that finish the task from this state."""
    return _SCRIPTS[task.name](task, pos, held)


def _mm(p: np.ndarray) -> tuple[int, ...]:
    return tuple(int(round(v * 1000)) for v in p)


def _pick_place(name: str, pos: Positions, held: str | None, goal: np.ndarray) -> list[Plan]:
    steps = [] if held == name else [Plan("pick", _mm(pos[name]))]
    return steps + [Plan("place", _mm(goal))]


def _align_two_cube(task: AlignTwoCube, pos: Positions, held: str | None) -> list[Plan]:
    out: list[Plan] = []
    if held is not None:
        out += [Plan("place", _mm(np.array([0.0, pos[held][1], CUBE_HALF])))]
    for name in ("red_cube", "green_cube"):
        p = pos[name]
        if name != held and (abs(p[0]) > 0.004 or p[2] > 0.05):
            out += _pick_place(name, pos, None, np.array([0.0, p[1], CUBE_HALF]))
    return out


def _place_two_cube(task: PlaceTwoCube, pos: Positions, held: str | None) -> list[Plan]:
    out: list[Plan] = []
    order = ["red_cube", "green_cube"]
    if held in order:  # finish what is in hand first
        order.remove(held)
        order.insert(0, held)
    for cube in order:
        if cube == held or not task.in_goal(pos, cube) or pos[cube][2] > 0.05:
            goal = pos[task.goal_of[cube]].copy()
            goal[2] = CUBE_HALF
            out += _pick_place(cube, pos, held, goal)
    return out


def _stack_three_cube(task: StackThreeCube, pos: Positions, held: str | None) -> list[Plan]:
    red, green, purple = pos["red_cube"], pos["green_cube"], pos["purple_cube"]
    out: list[Plan] = []
    if held == "purple_cube" and not task.on(red, green):  # put it down out of the way
        spot = np.array([-0.05, 0.0 if abs(green[1]) > 0.08 else 0.15, CUBE_HALF])
        out.append(Plan("place", _mm(spot)))
        purple, held = spot, None
    if held == "red_cube" or not task.on(red, green):
        out += _pick_place("red_cube", pos, held, green + [0, 0, 2 * CUBE_HALF])
        red, held = green + [0, 0, 2 * CUBE_HALF], None
    if out or held == "purple_cube" or not task.on(purple, red):
        if held != "purple_cube":
            out.append(Plan("pick", _mm(purple)))
        out.append(Plan("place", _mm(red + [0, 0, 2 * CUBE_HALF])))
    return out


def _put_apple_in_drawer(task: PutAppleInDrawer, pos: Positions, held: str | None) -> list[Plan]:
    out: list[Plan] = []
    if not task.in_drawer(pos) or held == "apple":
        if held != "apple":
            out.append(Plan("pick", _mm(pos["apple"])))
        # the open part of the tray, beyond the cabinet's front
        tray = pos["drawer"].copy()
        exposed_front = tray[1] + TRAY_DEPTH / 2
        tray[1] = (max(tray[1] - TRAY_DEPTH / 2, CABINET_FRONT_Y) + exposed_front) / 2
        tray[2] += 0.01
        out.append(Plan("place", _mm(tray)))
    if task.opening() > DRAWER_CLOSED_BELOW / 2:
        h = pos["drawer_handle"]
        start = np.array([h[0], h[1] + 0.04, h[2]])
        end = np.array([h[0], CABINET_FRONT_Y + WALL + 0.002, h[2]])
        out.append(Plan("push", _mm(start) + _mm(end)))
    return out


_SCRIPTS: dict[str, Callable[..., list[Plan]]] = {
    AlignTwoCube.name: _align_two_cube,
    PlaceTwoCube.name: _place_two_cube,
    StackThreeCube.name: _stack_three_cube,
    PutAppleInDrawer.name: _put_apple_in_drawer,
}
