"""The four tasks of the paper: objects, seeded layouts, stages and success.

Facts follow the paper's public code (RAGEN-AI/VAGEN, primitive_skill): the 4 cm cubes,
the workspace x in [-100, 150] mm, y in [-200, 200] mm, z in [10, 200] mm, the spawn
regions, the 50 mm goal discs at (80, -100) and (80, 100), the 10 mm alignment
tolerance, and the stage definitions. The apple and the drawer are our own: a sphere
and an articulation with one prismatic joint, both built in code (no asset download).

World frame: metres, x away from the robot (towards the camera), y to the camera's
right, z up from the table top. Positions shown to the agent are millimetres. The
scripted expert that solves each task is in `oracle.py`.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Any, ClassVar

import numpy as np
import sapien
import torch
from mani_skill.envs.scene import ManiSkillScene
from mani_skill.utils.building import actors
from mani_skill.utils.structs.pose import Pose
from scipy.spatial.transform import Rotation

CUBE_HALF = 0.02
WORKSPACE_MM = ((-100.0, 150.0), (-200.0, 200.0), (10.0, 200.0))
MIN_SEPARATION = 0.07  # metres between spawned object centres

RED = (1.0, 0.0, 0.0, 1.0)
GREEN = (0.0, 1.0, 0.0, 1.0)
PURPLE = (1.0, 0.0, 1.0, 1.0)


def _quat_wxyz_z(yaw: float) -> list[float]:
    x, y, z, w = Rotation.from_euler("z", yaw).as_quat()
    return [w, x, y, z]


def _set_pose(actor: Any, p: np.ndarray, yaw: float = 0.0) -> None:
    actor.set_pose(
        Pose.create_from_pq(
            p=torch.tensor(np.asarray([p], dtype=np.float32)),
            q=torch.tensor([_quat_wxyz_z(yaw)], dtype=torch.float32),
        )
    )


def _pos(actor: Any) -> np.ndarray:
    return actor.pose.p[0].cpu().numpy().astype(float)


def _yaw(actor: Any) -> float:
    w, x, y, z = actor.pose.q[0].cpu().numpy().astype(float)
    return float(Rotation.from_quat([x, y, z, w]).as_euler("xyz")[2])


def sample_apart(
    rng: np.random.Generator,
    regions: list[tuple[tuple[float, float], ...]],
    placed: list[np.ndarray] | None = None,
) -> list[np.ndarray]:
    """One xy point per region (x range, y range), every two at least MIN_SEPARATION apart."""
    points = list(placed or [])
    out: list[np.ndarray] = []
    for (x0, x1), (y0, y1) in regions:
        for _ in range(1000):
            p = np.array([rng.uniform(x0, x1), rng.uniform(y0, y1)])
            if all(np.linalg.norm(p - q[:2]) >= MIN_SEPARATION for q in points):
                break
        points.append(p)
        out.append(p)
    return out


class Task(ABC):
    """A task: builds its objects into a scene and judges the state."""

    name: ClassVar[str]
    instruction: ClassVar[str]
    workspace_mm: ClassVar[tuple[tuple[float, float], ...]] = WORKSPACE_MM

    def __init__(self) -> None:
        self.objects: dict[str, Any] = {}  # name -> actor, in the order they are listed
        self.graspable: tuple[str, ...] = ()

    # ---- scene ---------------------------------------------------------------
    @abstractmethod
    def build(self, scene: ManiSkillScene) -> None: ...

    @abstractmethod
    def sample_layout(self, rng: np.random.Generator) -> dict[str, Any]:
        """Initial poses drawn from `rng` (the only source of randomness)."""

    @abstractmethod
    def initialize(self, layout: dict[str, Any]) -> None:
        """Put the objects where `layout` says."""

    # ---- state -----------------------------------------------------------------
    def positions(self) -> dict[str, np.ndarray]:
        """Each object's reference point (metres, world)."""
        return {name: _pos(actor) for name, actor in self.objects.items()}

    def yaw(self, name: str) -> float | None:
        """Heading of an object's faces (radians), None for a round object."""
        return _yaw(self.objects[name])

    def obstacles(self) -> dict[str, list[np.ndarray]]:
        """Points (metres) the hand should keep clear of, by object; a long object gives
        several points along its length."""
        return {name: [p] for name, p in self.positions().items()}

    def extra(self) -> dict[str, Any]:
        """Task facts beyond positions (shown to the agent and kept in the ground truth)."""
        return {}

    def grasp_offset(self, name: str) -> float:
        """Height above an object's reference point where the fingers close (metres)."""
        return 0.0

    @abstractmethod
    def stages(self, pos: dict[str, np.ndarray], held: str | None) -> list[bool]:
        """Which stages are completed; the last entry is success."""


# ---------------------------------------------------------------------------------------
class _CubeTask(Task):
    cube_colors: ClassVar[dict[str, tuple[float, ...]]] = {}

    def build(self, scene: ManiSkillScene) -> None:
        for name, color in self.cube_colors.items():
            self.objects[name] = actors.build_cube(
                scene,
                half_size=CUBE_HALF,
                color=list(color),
                name=name,
                initial_pose=sapien.Pose(p=[0, 0, CUBE_HALF]),
            )
        self.graspable = tuple(self.cube_colors)

    def initialize(self, layout: dict[str, Any]) -> None:
        for name, (xy, yaw) in layout.items():
            if name in self.objects:
                _set_pose(self.objects[name], np.array([xy[0], xy[1], CUBE_HALF]), yaw)

    def _layout(self, rng: np.random.Generator, regions: list) -> dict[str, Any]:
        points = sample_apart(rng, regions)
        return {
            name: (p, float(rng.uniform(0, np.pi / 2)))
            for name, p in zip(self.cube_colors, points, strict=True)
        }


class AlignTwoCube(_CubeTask):
    name = "AlignTwoCube"
    instruction = (
        "Align the cubes on the y-axis: the x-coordinate of both cubes must be 0 (within 10 mm)."
    )
    cube_colors = {"red_cube": RED, "green_cube": GREEN}
    tolerance = 0.01

    def sample_layout(self, rng: np.random.Generator) -> dict[str, Any]:
        return self._layout(rng, [((0.10, 0.15), (-0.20, 0.10)), ((0.10, 0.15), (0.10, 0.20))])

    def _aligned(self, p: np.ndarray) -> bool:
        return abs(p[0]) <= self.tolerance and p[2] <= 0.05

    def stages(self, pos: dict[str, np.ndarray], held: str | None) -> list[bool]:
        red, green = self._aligned(pos["red_cube"]), self._aligned(pos["green_cube"])
        return [red, green, red and green and held is None]


class PlaceTwoCube(_CubeTask):
    name = "PlaceTwoCube"
    instruction = "Place the red cube on the left target and the green cube on the right target."
    cube_colors = {"red_cube": RED, "green_cube": GREEN}
    goal_radius = 0.05
    targets = {
        "left_target": np.array([0.08, -0.10, 0.0]),
        "right_target": np.array([0.08, 0.10, 0.0]),
    }
    goal_of = {"red_cube": "left_target", "green_cube": "right_target"}

    def build(self, scene: ManiSkillScene) -> None:
        super().build(scene)
        for name, p in self.targets.items():
            self.objects[name] = actors.build_red_white_target(
                scene,
                radius=self.goal_radius,
                thickness=1e-5,
                name=name,
                add_collision=False,
                body_type="kinematic",
                initial_pose=sapien.Pose(p=list(p), q=[0.7071068, 0, 0.7071068, 0]),
            )

    def sample_layout(self, rng: np.random.Generator) -> dict[str, Any]:
        return self._layout(rng, [((-0.10, 0.0), (-0.10, 0.10))] * 2)

    def in_goal(self, pos: dict[str, np.ndarray], cube: str) -> bool:
        goal = pos[self.goal_of[cube]]
        return bool(np.linalg.norm(pos[cube][:2] - goal[:2]) <= self.goal_radius)

    def stages(self, pos: dict[str, np.ndarray], held: str | None) -> list[bool]:
        red_in, green_in = self.in_goal(pos, "red_cube"), self.in_goal(pos, "green_cube")
        return [
            held == "red_cube",
            red_in and held is None,
            red_in and held == "green_cube",
            red_in and green_in and held is None,
        ]


class StackThreeCube(_CubeTask):
    name = "StackThreeCube"
    instruction = (
        "Stack the red cube on top of the green cube, then stack the purple cube on "
        "top of the red cube."
    )
    cube_colors = {"red_cube": RED, "green_cube": GREEN, "purple_cube": PURPLE}

    def sample_layout(self, rng: np.random.Generator) -> dict[str, Any]:
        return self._layout(rng, [((-0.10, 0.15), (-0.20, 0.20))] * 3)

    def extra(self) -> dict[str, Any]:
        return {"cube_size_mm": int(round(2 * CUBE_HALF * 1000))}

    @staticmethod
    def on(top: np.ndarray, bottom: np.ndarray) -> bool:
        return bool(
            np.linalg.norm(top[:2] - bottom[:2]) < CUBE_HALF and top[2] > bottom[2] + CUBE_HALF
        )

    def stages(self, pos: dict[str, np.ndarray], held: str | None) -> list[bool]:
        red_on_green = self.on(pos["red_cube"], pos["green_cube"]) and held != "red_cube"
        purple_on_red = self.on(pos["purple_cube"], pos["red_cube"]) and held != "purple_cube"
        return [
            held == "red_cube",
            red_on_green,
            red_on_green and held == "purple_cube",
            red_on_green and purple_on_red and held is None,
        ]


# ---------------------------------------------------------------------------------------
APPLE_RADIUS = 0.03

# The cabinet: an open-fronted box on the table; its drawer slides out along +y.
CABINET_CENTER_X = 0.05
CABINET_BACK_Y = -0.22
CABINET_FRONT_Y = -0.06
CABINET_WIDTH = 0.18  # along x
CABINET_HEIGHT = 0.10
WALL = 0.01
TRAY_WIDTH = 0.15  # outer, along x
TRAY_DEPTH = 0.14  # outer, along y
TRAY_BOTTOM_Z = 0.012  # underside of the tray floor
TRAY_FLOOR = 0.008
TRAY_WALL = 0.006
TRAY_WALL_TOP = 0.08
DRAWER_TRAVEL = 0.13  # joint limit
DRAWER_START_OPEN = 0.12
DRAWER_CLOSED_BELOW = 0.02  # metres of opening that still count as closed


class PutAppleInDrawer(Task):
    name = "PutAppleInDrawer"
    instruction = "Put the apple in the drawer and close the drawer."

    def __init__(self) -> None:
        super().__init__()
        self.drawer: Any = None

    def build(self, scene: ManiSkillScene) -> None:
        self._build_apple(scene)
        self._build_drawer(scene)
        self.graspable = ("apple",)

    def _build_apple(self, scene: ManiSkillScene) -> None:
        b = scene.create_actor_builder()
        skin = sapien.render.RenderMaterial(base_color=[0.8, 0.05, 0.05, 1.0], roughness=0.4)
        stem = sapien.render.RenderMaterial(base_color=[0.35, 0.2, 0.05, 1.0])
        grip = sapien.physx.PhysxMaterial(static_friction=1.5, dynamic_friction=1.5, restitution=0)
        b.add_sphere_collision(radius=APPLE_RADIUS, material=grip, density=600)
        b.add_sphere_visual(radius=APPLE_RADIUS, material=skin)
        b.add_cylinder_visual(
            pose=sapien.Pose([0, 0, APPLE_RADIUS], [0.7071068, 0, 0.7071068, 0]),
            radius=0.003,
            half_length=0.008,
            material=stem,
        )
        b.initial_pose = sapien.Pose(p=[0, 0.15, APPLE_RADIUS])
        self.objects["apple"] = b.build(name="apple")

    def _build_drawer(self, scene: ManiSkillScene) -> None:
        wood = sapien.render.RenderMaterial(base_color=[0.55, 0.38, 0.22, 1.0], roughness=0.7)
        front = sapien.render.RenderMaterial(base_color=[0.2, 0.35, 0.7, 1.0], roughness=0.5)
        builder = scene.create_articulation_builder()
        cabinet = builder.create_link_builder(parent=None)
        cabinet.set_name("cabinet")
        depth = CABINET_FRONT_Y - CABINET_BACK_Y
        cy = (CABINET_FRONT_Y + CABINET_BACK_Y) / 2
        hw, hd, hh = CABINET_WIDTH / 2, depth / 2, CABINET_HEIGHT / 2
        boxes = [  # (centre, half size) of each plate, in the cabinet frame (origin at the table)
            ([CABINET_CENTER_X, cy, WALL / 2], [hw, hd, WALL / 2]),  # floor
            ([CABINET_CENTER_X, cy, CABINET_HEIGHT - WALL / 2], [hw, hd, WALL / 2]),  # top
            ([CABINET_CENTER_X - hw + WALL / 2, cy, hh], [WALL / 2, hd, hh]),  # side
            ([CABINET_CENTER_X + hw - WALL / 2, cy, hh], [WALL / 2, hd, hh]),  # side
            ([CABINET_CENTER_X, CABINET_BACK_Y + WALL / 2, hh], [hw, WALL / 2, hh]),  # back
        ]
        for centre, half in boxes:
            cabinet.add_box_collision(pose=sapien.Pose(centre), half_size=half)
            cabinet.add_box_visual(pose=sapien.Pose(centre), half_size=half, material=wood)

        tray = builder.create_link_builder(parent=cabinet)
        tray.set_name("drawer")
        # tray frame: origin at the tray's floor centre when closed
        tw, td = TRAY_WIDTH / 2, TRAY_DEPTH / 2
        wall_h = (TRAY_WALL_TOP - TRAY_BOTTOM_Z) / 2
        parts = [
            ([0, 0, TRAY_FLOOR / 2], [tw, td, TRAY_FLOOR / 2], wood),
            ([-tw + TRAY_WALL / 2, 0, wall_h], [TRAY_WALL / 2, td, wall_h], wood),
            ([tw - TRAY_WALL / 2, 0, wall_h], [TRAY_WALL / 2, td, wall_h], wood),
            ([0, -td + TRAY_WALL / 2, wall_h], [tw, TRAY_WALL / 2, wall_h], wood),
            # the front panel, taller and wider than the tray, outside the cabinet
            (
                [0, td + WALL / 2, (CABINET_HEIGHT - TRAY_BOTTOM_Z) / 2 - 0.002],
                [hw - 0.002, WALL / 2, (CABINET_HEIGHT - TRAY_BOTTOM_Z) / 2 - 0.004],
                front,
            ),
        ]
        for centre, half, mat in parts:
            tray.add_box_collision(pose=sapien.Pose(centre), half_size=half)
            tray.add_box_visual(pose=sapien.Pose(centre), half_size=half, material=mat)
        tray_origin = [CABINET_CENTER_X, CABINET_FRONT_Y - td, TRAY_BOTTOM_Z]
        tray.set_joint_name("drawer_slide")
        tray.set_joint_properties(
            type="prismatic",
            limits=[[0.0, DRAWER_TRAVEL]],
            pose_in_parent=sapien.Pose(tray_origin, [0.7071068, 0, 0, 0.7071068]),  # x -> +y
            pose_in_child=sapien.Pose([0, 0, 0], [0.7071068, 0, 0, 0.7071068]),
            friction=0.05,
            damping=5.0,
        )
        builder.initial_pose = sapien.Pose()
        self.drawer = builder.build(name="cabinet", fix_root_link=True)
        self.tray_link = self.drawer.links_map["drawer"]

    # ---- layout ------------------------------------------------------------------
    def sample_layout(self, rng: np.random.Generator) -> dict[str, Any]:
        return {"apple": np.array([rng.uniform(-0.08, 0.12), rng.uniform(0.12, 0.19)])}

    def initialize(self, layout: dict[str, Any]) -> None:
        xy = layout["apple"]
        _set_pose(self.objects["apple"], np.array([xy[0], xy[1], APPLE_RADIUS]))
        self.drawer.set_qpos(torch.tensor([[DRAWER_START_OPEN]], dtype=torch.float32))
        self.drawer.set_qvel(torch.zeros((1, 1)))

    # ---- state -------------------------------------------------------------------
    def opening(self) -> float:
        return float(self.drawer.get_qpos()[0, 0])

    def positions(self) -> dict[str, np.ndarray]:
        tray = _pos(self.tray_link)
        inside = tray + np.array([0, 0, TRAY_FLOOR + APPLE_RADIUS])
        handle = tray + np.array([0, TRAY_DEPTH / 2 + WALL, (CABINET_HEIGHT - TRAY_BOTTOM_Z) / 2])
        return {"apple": _pos(self.objects["apple"]), "drawer": inside, "drawer_handle": handle}

    def yaw(self, name: str) -> float | None:
        return None  # the apple is round

    def obstacles(self) -> dict[str, list[np.ndarray]]:
        out = super().obstacles()
        # the drawer's front panel is long: points along its top edge, every 2 cm
        handle = self.positions()["drawer_handle"]
        top = handle[2] + (CABINET_HEIGHT - TRAY_BOTTOM_Z) / 2
        xs = np.arange(-CABINET_WIDTH / 2, CABINET_WIDTH / 2 + 1e-9, 0.02)
        out["drawer_handle"] = [np.array([handle[0] + dx, handle[1], top]) for dx in xs]
        return out

    def extra(self) -> dict[str, Any]:
        return {"drawer_opening_mm": int(round(self.opening() * 1000))}

    def in_drawer(self, pos: dict[str, np.ndarray]) -> bool:
        rel = pos["apple"] - _pos(self.tray_link)
        inner_x = TRAY_WIDTH / 2 - TRAY_WALL
        inner_y = TRAY_DEPTH / 2
        return bool(
            abs(rel[0]) <= inner_x
            and abs(rel[1]) <= inner_y
            and TRAY_FLOOR <= rel[2] <= TRAY_WALL_TOP
        )

    def stages(self, pos: dict[str, np.ndarray], held: str | None) -> list[bool]:
        inside = self.in_drawer(pos) and held is None
        closed = self.opening() <= DRAWER_CLOSED_BELOW
        return [held == "apple", inside, inside and closed]


TASKS: dict[str, type[Task]] = {
    t.name: t for t in (AlignTwoCube, PlaceTwoCube, StackThreeCube, PutAppleInDrawer)
}
