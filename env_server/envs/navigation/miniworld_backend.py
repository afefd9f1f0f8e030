"""MiniWorld backend: procedurally furnished multi-room interiors, rendered headless.

Rooms are axis-aligned rectangles whose walls lie on multiples of 0.5 m; the agent lives
on the lattice of points 0.25 m off those multiples, so every 0.5 m move goes from lattice
point to lattice point and every point keeps a clearance from the walls. A move is allowed
when the agent's disc fits at the end point and along the way (walls, furniture); the
oracle searches the same moves, so its plans always execute.

The layouts (rooms, doors, furniture) and their generation are in `miniworld_layout.py`,
the walls and free space a layout gives in `miniworld_collision.py`. What the scene looks
like and how it is drawn (headless EGL, textures, meshes) is in `render.py`, through which
this module reaches MiniWorld.
"""

from __future__ import annotations

import math

import numpy as np

from env_server.core import EnvError

from . import planner
from .backend import (
    HORIZON_MAX,
    HORIZON_MIN,
    LOOK_DEGREES,
    STEP_METRES,
    Backend,
    BackendSettings,
)
from .geometry import ObjectState, Pose, bearing, relative
from .miniworld_collision import (
    AGENT_RADIUS,
    GRID_STEP,
    free_grid,
    segments_cross,
    wall_segments,
)
from .miniworld_layout import Layout, RoomSpec, generate_layout, where_phrase
from .render import RenderedWorld, make_entity
from .tasks import KINDS, NavTask, appearance, write_instruction

LATTICE_OFFSET = 0.25  # lattice points sit this far off the 0.5 m wall grid
DOOR_HEIGHT = 2.2
MAX_VIEW_DISTANCE = 12.0
CAMERA_HEIGHT = 1.2  # eye height, metres (MiniWorld's default 1.5 hides objects near the feet)
GENERATION_ATTEMPTS = 60
START_TRIES = 20  # start cells tried per layout for one that sees an object


class _World(RenderedWorld):
    """A MiniWorld env that builds whatever `Layout` it is given."""

    def __init__(self, image_size: int) -> None:
        self._layout: Layout | None = None
        self._agent_start: tuple[float, float, float] = (LATTICE_OFFSET, LATTICE_OFFSET, 0.0)
        super().__init__(image_size)

    def load(self, layout: Layout, agent: tuple[float, float, float]) -> None:
        self._layout, self._agent_start = layout, agent
        self.reset(seed=0)

    def _gen_world(self) -> None:
        layout = self._layout or Layout(
            [RoomSpec(0, 3, 0, 3, "concrete", "floor_tiles_bw", "white")], []
        )
        rooms = [
            self.add_rect_room(
                min_x=r.min_x,
                max_x=r.max_x,
                min_z=r.min_z,
                max_z=r.max_z,
                wall_tex=r.wall_tex,
                floor_tex=r.floor_tex,
                ceil_tex=r.ceil_tex,
            )
            for r in layout.rooms
        ]
        for d in layout.doors:
            extent = (
                {"min_z": d.lo, "max_z": d.hi} if d.axis == "z" else {"min_x": d.lo, "max_x": d.hi}
            )
            self.connect_rooms(rooms[d.room_a], rooms[d.room_b], max_y=DOOR_HEIGHT, **extent)
        for o in layout.objects:
            self.place_entity(
                make_entity(o.kind, o.color), pos=np.array([o.x, 0.0, o.z]), dir=o.dir
            )
        x, z, d = self._agent_start
        self.place_agent(pos=np.array([x, 0.0, z]), dir=d)


# Worlds hold GL objects that MiniWorld never frees; closed ones wait here for the next
# session of the same image size instead of leaking.
_POOL: dict[int, list[_World]] = {}


def _take_world(image_size: int) -> _World:
    free = _POOL.get(image_size)
    return free.pop() if free else _World(image_size)


class MiniWorldBackend(Backend):
    def __init__(self, settings: BackendSettings) -> None:
        self.settings = settings
        self.world: _World | None = _take_world(settings.image_size)
        self.task: NavTask | None = None
        self.layout: Layout | None = None
        self._cell = (0, 0)
        self._heading = 0  # quarter turns counter-clockwise from +x (MiniWorld's dir / 90°)
        self._horizon = 0.0
        self._world_layout: Layout | None = None  # the layout the GL world holds
        self._walls = np.zeros((0, 2, 2))
        self._grid = np.zeros((0, 0), dtype=bool)
        self._free: dict[tuple[int, int], bool] = {}
        self._passable: dict[tuple[tuple[int, int], tuple[int, int]], bool] = {}

    # ---- lattice --------------------------------------------------------------------
    @staticmethod
    def cell_xz(cell: tuple[int, int]) -> tuple[float, float]:
        return LATTICE_OFFSET + STEP_METRES * cell[0], LATTICE_OFFSET + STEP_METRES * cell[1]

    @staticmethod
    def xz_cell(x: float, z: float) -> tuple[int, int]:
        return round((x - LATTICE_OFFSET) / STEP_METRES), round((z - LATTICE_OFFSET) / STEP_METRES)

    @staticmethod
    def heading_vectors(heading: int) -> tuple[tuple[int, int], tuple[int, int]]:
        """Lattice (= world) forward and right vectors of a quarter-turn heading."""
        angle = heading * math.pi / 2
        forward = (round(math.cos(angle)), round(-math.sin(angle)))
        right = (round(math.sin(angle)), round(math.cos(angle)))
        return forward, right

    def _prepare(self, layout: Layout) -> None:
        """Collision geometry of a layout (no rendering): walls and the free-space grid."""
        self.layout = layout
        self._free.clear()
        self._passable.clear()
        self._walls = wall_segments(layout)
        self._grid = free_grid(layout, self._walls)

    def _is_free(self, x: float, z: float) -> bool:
        """Whether the agent's disc fits at (x, z): the point's cell of the fine free grid."""
        i, j = round(x / GRID_STEP), round(z / GRID_STEP)
        return (
            0 <= i < self._grid.shape[0] and 0 <= j < self._grid.shape[1] and bool(self._grid[i, j])
        )

    def free(self, cell: tuple[int, int]) -> bool:
        if cell not in self._free:
            self._free[cell] = self._is_free(*self.cell_xz(cell))
        return self._free[cell]

    def passable(self, a: tuple[int, int], b: tuple[int, int]) -> bool:
        key = (a, b) if a <= b else (b, a)
        if key not in self._passable:
            (ax, az), (bx, bz) = self.cell_xz(a), self.cell_xz(b)
            ok = self.free(a) and self.free(b)
            for t in (0.25, 0.5, 0.75):
                ok = ok and self._is_free(ax + t * (bx - ax), az + t * (bz - az))
            self._passable[key] = ok
        return self._passable[key]

    # ---- tasks ----------------------------------------------------------------------
    def sample_task(self, task_set: str, seed: int, max_actions: int) -> NavTask:
        rng = np.random.default_rng([seed, TASK_SET_SALT[task_set]])
        for _ in range(GENERATION_ATTEMPTS):
            task = self._try_generate(task_set, rng, max_actions)
            if task is not None:
                return task
        raise EnvError(
            f"no solvable {task_set} task for seed {seed} within {max_actions} actions and a "
            f"success distance of {self.settings.success_distance:g} m; allow more actions "
            "(max_actions_per_episode, max_turns) or change success_distance"
        )

    def _try_generate(
        self, task_set: str, rng: np.random.Generator, max_actions: int
    ) -> NavTask | None:
        layout, target = generate_layout(task_set, rng)
        if target is None:
            return None
        target_room = target.room
        if task_set == "long_horizon":  # a room from which the target is out of reach
            reach = self.settings.success_distance + 0.5
            start_rooms = [
                i
                for i, r in enumerate(layout.rooms)
                if i != target_room and r.distance_to(target.x, target.z) >= reach
            ]
            if not start_rooms:
                return None
            start_room = start_rooms[int(rng.integers(len(start_rooms)))]
        else:
            start_room = target_room
        self._prepare(layout)
        room = layout.rooms[start_room]
        candidates = [
            cell
            for cell in (
                self.xz_cell(x, z)
                for x in np.arange(room.min_x + LATTICE_OFFSET, room.max_x, STEP_METRES)
                for z in np.arange(room.min_z + LATTICE_OFFSET, room.max_z, STEP_METRES)
            )
            if self.free(cell)
            and math.dist(self.cell_xz(cell), (target.x, target.z))
            >= self.settings.success_distance + 1.0
        ]
        # a start that faces into the room, as the paper's tasks do: something in view, and
        # of those headings one that sees the most other objects (so that whether the target
        # is in view is left to chance, not chosen)
        for index in rng.permutation(len(candidates))[:START_TRIES]:
            cell = candidates[int(index)]
            seen = [self._in_view(cell, h, target.id) for h in range(4)]
            if any(others or sees_target for others, sees_target in seen):
                break
        else:
            return None
        most = max(others for others, sees_target in seen if others or sees_target)
        headings = [h for h, (others, t) in enumerate(seen) if others == most and (others or t)]
        heading = headings[int(rng.integers(len(headings)))]
        self._set_agent(cell, heading, 0.0)
        plan = self.plan(target.id, max_actions)
        if plan is None or len(plan) < 2:
            return None
        x, z = self.cell_xz(cell)
        kind = KINDS[target.kind]
        where = where_phrase(layout, target)
        instruction = write_instruction(
            task_set,
            rng,
            name=target.name,
            use=kind.use[int(rng.integers(len(kind.use)))] if kind.use else None,
            look=appearance(target.kind, target.color),
            where=where,
        )
        task = NavTask(
            task_set=task_set,
            instruction=instruction,
            target_id=target.id,
            target_type=target.name,
            scene=layout,
            agent_position=(x, 0.0, z),
            agent_rotation=heading * 90.0,
            agent_horizon=0.0,
            optimal_actions=len(self.plan(target.id, max_actions, facing=False) or plan),
        )
        self.task = task
        return task

    def _in_view(self, cell: tuple[int, int], heading: int, target_id: str) -> tuple[int, bool]:
        """From `cell` facing `heading` (camera level): how many objects other than the
        target are in view, and whether the target is."""
        self._set_agent(cell, heading, 0.0)
        visible = [o.id for o in self.objects() if o.visible]
        return sum(i != target_id for i in visible), target_id in visible

    # ---- Backend ----------------------------------------------------------------------
    def _load(self, layout: Layout, agent: tuple[float, float, float]) -> None:
        assert self.world is not None
        if self.layout is not layout:
            self._prepare(layout)
        self.world.load(layout, agent)
        self._world_layout = layout
        self.world.agent.radius = AGENT_RADIUS
        self.world.agent.cam_fov_y = self.settings.fov
        self.world.agent.cam_height = CAMERA_HEIGHT

    def _set_agent(self, cell: tuple[int, int], heading: int, horizon: float) -> None:
        assert self.world is not None
        self._cell, self._heading, self._horizon = cell, heading % 4, horizon
        x, z = self.cell_xz(cell)
        self.world.agent.pos = np.array([x, 0.0, z])
        self.world.agent.dir = self._heading * math.pi / 2
        self.world.agent.cam_pitch = -horizon

    def reset(self, task: NavTask) -> None:
        if not isinstance(task.scene, Layout):
            raise EnvError("the MiniWorld backend needs a generated layout as the task's scene")
        if self._world_layout is not task.scene:
            self._load(task.scene, (task.agent_position[0], task.agent_position[2], 0.0))
        self.task = task
        x, _, z = task.agent_position
        self._set_agent(self.xz_cell(x, z), round(task.agent_rotation / 90.0), task.agent_horizon)

    def apply(self, action: str) -> bool:
        if action in ("rotateleft", "rotateright"):
            self._set_agent(
                self._cell, self._heading + (1 if action == "rotateleft" else -1), self._horizon
            )
            return True
        if action in ("lookup", "lookdown"):
            horizon = self._horizon + (LOOK_DEGREES if action == "lookdown" else -LOOK_DEGREES)
            if not HORIZON_MIN <= horizon <= HORIZON_MAX:
                return False
            self._set_agent(self._cell, self._heading, horizon)
            return True
        forward, right = self.heading_vectors(self._heading)
        nxt, _, _ = planner.apply((self._cell, forward, right), action)
        if not self.passable(self._cell, nxt):
            return False
        self._set_agent(nxt, self._heading, self._horizon)
        return True

    def render(self) -> np.ndarray:
        assert self.world is not None
        return self.world.render_obs()

    def pose(self) -> Pose:
        x, z = self.cell_xz(self._cell)
        forward, right = self.heading_vectors(self._heading)
        return Pose(
            x=x,
            z=z,
            forward=(float(forward[0]), float(forward[1])),
            right=(float(right[0]), float(right[1])),
            heading=self._heading * 90.0,
            horizon=self._horizon,
        )

    def objects(self) -> list[ObjectState]:
        assert self.world is not None and self.layout is not None
        pose = self.pose()
        half_fov = self.settings.fov / 2  # square image: horizontal = vertical field of view
        walls = self._walls
        eye = np.array([pose.x, pose.z])
        out = []
        for o in self.layout.objects:
            right, forward = relative(pose, o.x, o.z)
            dist = math.hypot(right, forward)
            margin = math.degrees(math.atan2(o.radius, max(dist, 1e-6)))
            # the object's vertical extent as seen from the camera, against the tilted view
            low = math.degrees(math.atan2(-CAMERA_HEIGHT, max(forward, 1e-6)))
            high = math.degrees(math.atan2(o.height - CAMERA_HEIGHT, max(forward, 1e-6)))
            pitch = -pose.horizon
            visible = (
                dist <= MAX_VIEW_DISTANCE
                and forward > 0
                and abs(bearing(right, forward)) <= half_fov + margin
                and high >= pitch - half_fov
                and low <= pitch + half_fov
                and not segments_cross(eye, np.array([o.x, o.z]), walls[:, 0], walls[:, 1]).any()
            )
            out.append(ObjectState(o.id, o.name, o.x, o.z, bool(visible)))
        return out

    def plan(self, target_id: str, max_len: int, facing: bool = True) -> list[str] | None:
        assert self.layout is not None
        target = next(o for o in self.layout.objects if o.id == target_id)
        is_goal = planner.reach_goal(
            (target.x, target.z), self.cell_xz, self.settings.success_distance, facing
        )
        forward, right = self.heading_vectors(self._heading)
        return planner.shortest_plan((self._cell, forward, right), self.passable, is_goal, max_len)

    def agent_state(self) -> tuple[tuple[int, int], int, float]:
        return self._cell, self._heading, self._horizon

    def set_agent_state(self, state: tuple[tuple[int, int], int, float]) -> None:
        cell, heading, horizon = state
        self._set_agent(tuple(cell), heading, horizon)

    def close(self) -> None:
        if self.world is not None:
            _POOL.setdefault(self.settings.image_size, []).append(self.world)
            self.world = None


TASK_SET_SALT = {
    "base": 0,
    "common_sense": 1,
    "complex_instruction": 2,
    "visual_appearance": 3,
    "long_horizon": 4,
}
