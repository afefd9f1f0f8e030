"""Motion primitives executed by the real arm through end-effector waypoints.

The Panda is driven by ManiSkill's `pd_ee_pose` controller: every control step gets an
absolute target pose of the tool centre point (TCP) in the robot's base frame plus a
gripper command. A primitive is a short list of waypoints; between two waypoints the
target moves along a straight line in small increments, then waits until the TCP has
settled. No motion planner is used (mplib is not needed).

All positions here are world coordinates in metres; the gripper always points down and
only its yaw changes (to line the fingers up with a cube's faces).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np
import torch
from scipy.spatial.transform import Rotation

from .scene import TabletopScene

if TYPE_CHECKING:
    from .tasks import Task

GRIPPER_OPEN = 1.0  # normalised gripper command: 1 = fully open (40 mm per finger)
GRIPPER_CLOSED = -1.0  # -1 = squeeze (target below zero so a grasped object is held with force)
STEP_LENGTH = 0.02  # metres the target moves per control step (20 Hz -> 0.4 m/s)
SETTLE_TOLERANCE = 0.003  # metres: a waypoint is reached when the TCP is this close
MAX_SETTLE_STEPS = 30
GRIPPER_STEPS = 8  # control steps to open or close the gripper
SAFE_HEIGHT = 0.10  # metres above a pick/place point where the approach starts


@dataclass
class MoveResult:
    reached: bool
    error: float  # metres between the TCP and the last waypoint


class ArmController:
    """Drives one scene's Panda through TCP waypoints (pd_ee_pose)."""

    def __init__(self, scene: TabletopScene) -> None:
        self.scene = scene
        self.gripper = GRIPPER_OPEN
        self.steps = 0  # control steps taken since the episode began
        # the TCP's orientation at the home pose: pointing straight down
        q = scene.agent.tcp.pose.q[0].cpu().numpy()
        self._down = Rotation.from_quat([q[1], q[2], q[3], q[0]])
        self.yaw = 0.0

    # ---- state ---------------------------------------------------------------
    @property
    def tcp(self) -> np.ndarray:
        return self.scene.agent.tcp.pose.p[0].cpu().numpy().astype(float)

    def _base(self) -> np.ndarray:
        return self.scene.agent.robot.pose.p[0].cpu().numpy().astype(float)

    # ---- low level -------------------------------------------------------------
    def _command(self, target: np.ndarray) -> None:
        rot = Rotation.from_euler("z", self.yaw) * self._down
        euler = rot.as_euler("XYZ")  # intrinsic XYZ, as the controller reads it
        action = np.concatenate([target - self._base(), euler, [self.gripper]])
        self.scene.step(torch.as_tensor(action[None], dtype=torch.float32))
        self.steps += 1

    def move_to(self, target: np.ndarray, yaw: float | None = None) -> MoveResult:
        """Move the TCP along a straight line to `target` (world, metres)."""
        target = np.asarray(target, dtype=float)
        if yaw is not None:
            self.yaw = yaw
        start = self.tcp
        distance = float(np.linalg.norm(target - start))
        n = max(1, int(np.ceil(distance / STEP_LENGTH)))
        for i in range(1, n + 1):
            self._command(start + (target - start) * (i / n))
        error = float(np.linalg.norm(self.tcp - target))
        for _ in range(MAX_SETTLE_STEPS):
            if error < SETTLE_TOLERANCE:
                break
            self._command(target)
            error = float(np.linalg.norm(self.tcp - target))
        return MoveResult(error < 3 * SETTLE_TOLERANCE, error)

    def set_gripper(self, command: float) -> None:
        self.gripper = command
        hold = self.tcp
        for _ in range(GRIPPER_STEPS):
            self._command(hold)

    def wait(self, steps: int) -> None:
        hold = self.tcp
        for _ in range(steps):
            self._command(hold)


# ---- the three primitives ------------------------------------------------------------

PICK_RADIUS = 0.03  # metres: a pick must aim this close to an object's grasp point
PLACE_CLEARANCE = 0.005  # metres above the asked height where the object is let go
NEIGHBOUR_RANGE = 0.15  # metres: objects this close influence the finger direction


class PrimitiveError(Exception):
    """A primitive that cannot be executed; the message says why (shown to the agent)."""


def _wrap_quarter(angle: float) -> float:
    """`angle` modulo 90 degrees, in [-45, 45) degrees (radians)."""
    return (angle + np.pi / 4) % (np.pi / 2) - np.pi / 4


class Skills:
    """pick / place / push on top of an ArmController, judged against the task's objects.

    `task` provides `positions()`, `obstacles()`, `graspable`, `yaw(name)` and
    `grasp_offset(name)`.
    """

    def __init__(self, arm: ArmController, task: Task) -> None:
        self.arm = arm
        self.task = task
        self.held: str | None = None

    # ---- grasp bookkeeping ---------------------------------------------------
    def grasped(self) -> str | None:
        """The object the fingers really hold now (contact forces), or None."""
        agent = self.arm.scene.agent
        for name in self.task.graspable:
            if bool(agent.is_grasping(self.task.objects[name])[0]):
                return name
        return None

    def _neighbour_heading(self, at: np.ndarray, exclude: str) -> float | None:
        """Direction (radians, in the table plane) to the nearest other object around `at`;
        objects right below `at` (a support) and far away ones do not count."""
        near = [
            p[:2] - at[:2]
            for n, points in self.task.obstacles().items()
            if n != exclude
            for p in points
            if 0.02 < np.linalg.norm(p[:2] - at[:2]) < NEIGHBOUR_RANGE
        ]
        if not near:
            return None
        nearest = min(near, key=np.linalg.norm)
        return float(np.arctan2(nearest[1], nearest[0]))

    @staticmethod
    def _best_yaw(candidates: list[float], heading: float | None) -> float:
        """The first candidate unless a neighbour is near: then the one whose fingers
        (closing along the TCP's y-axis, i.e. at yaw - 90 degrees) point most across it."""
        if heading is None:
            return candidates[0]
        return min(candidates, key=lambda yaw: abs(np.cos(yaw - np.pi / 2 - heading)))

    # ---- primitives --------------------------------------------------------------
    def pick(self, p: np.ndarray) -> str:
        self.held = self.grasped()  # what the fingers hold now (a grasp may have slipped)
        if self.held is not None:
            raise PrimitiveError(f"already holding the {self.held}; place it first")
        positions = self.task.positions()
        grasp_points = {
            n: positions[n] + [0, 0, self.task.grasp_offset(n)] for n in self.task.graspable
        }
        name, point = min(grasp_points.items(), key=lambda kv: np.linalg.norm(kv[1] - p))
        if np.linalg.norm(point - p) > PICK_RADIUS:
            raise PrimitiveError("there is no object to pick at that point")
        heading = self._neighbour_heading(p, name)
        face_yaw = self.task.yaw(name)
        if face_yaw is None:  # round: keep the hand's long side off the nearest neighbour
            yaw = 0.0 if heading is None else (heading + np.pi / 2) % np.pi - np.pi / 2
        else:  # line the fingers up with two faces
            base = _wrap_quarter(face_yaw)
            other = base + np.pi / 2 if base < 0 else base - np.pi / 2
            yaw = self._best_yaw([base, other], heading)
        arm = self.arm
        arm.set_gripper(GRIPPER_OPEN)
        self._go(p + [0, 0, SAFE_HEIGHT], yaw)
        self._go(p)
        arm.set_gripper(GRIPPER_CLOSED)
        self._go(p + [0, 0, SAFE_HEIGHT])
        self.held = self.grasped()
        if self.held is None:
            arm.set_gripper(GRIPPER_OPEN)
            return "picked nothing (the grasp slipped)"
        return f"picked an object at {tuple(int(round(v * 1000)) for v in point)}"

    def place(self, p: np.ndarray) -> str:
        self.held = self.grasped()  # what the fingers hold now (a grasp may have slipped)
        if self.held is None:
            raise PrimitiveError("nothing is held; pick something first")
        arm = self.arm
        offset = self.task.positions()[self.held] - arm.tcp  # object centre relative to the TCP
        tcp_goal = p - offset + [0, 0, PLACE_CLEARANCE]
        turns = [arm.yaw + k * np.pi / 2 for k in (0, 1, -1)]  # quarter turns keep a cube square
        yaw = self._best_yaw(
            [y for y in turns if abs(y) <= 0.75 * np.pi], self._neighbour_heading(p, self.held)
        )
        self._go(tcp_goal + [0, 0, SAFE_HEIGHT], yaw)
        self._go(tcp_goal)
        arm.set_gripper(GRIPPER_OPEN)
        self._go(tcp_goal + [0, 0, SAFE_HEIGHT])
        self.held = self.grasped()
        return "placed the held object"

    def push(self, p1: np.ndarray, p2: np.ndarray) -> str:
        self.held = self.grasped()  # what the fingers hold now (a grasp may have slipped)
        if self.held is not None:
            raise PrimitiveError(f"cannot push while holding the {self.held}; place it first")
        arm = self.arm
        arm.set_gripper(GRIPPER_CLOSED)
        self._go(p1 + [0, 0, SAFE_HEIGHT], 0.0)
        self._go(p1)
        self._go(p2, strict=False)  # the stroke may end against something (a drawer's stop)
        self._go(p2 + [0, 0, SAFE_HEIGHT])
        arm.set_gripper(GRIPPER_OPEN)
        return "pushed"

    def _go(self, target: np.ndarray, yaw: float | None = None, strict: bool = True) -> None:
        result = self.arm.move_to(np.asarray(target, dtype=float), yaw)
        if strict and result.error > 0.02:
            self.arm.move_to(self.arm.tcp + [0, 0, SAFE_HEIGHT / 2])  # back off what blocked it
            raise PrimitiveError(
                f"the arm could not reach the point (stopped {result.error * 1000:.0f} mm away)"
            )
