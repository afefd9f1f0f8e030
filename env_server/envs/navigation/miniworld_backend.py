"""MiniWorld backend: procedurally furnished multi-room interiors, rendered headless.

Rooms are axis-aligned rectangles whose walls lie on multiples of 0.5 m; the agent lives
on the lattice of points 0.25 m off those multiples, so every 0.5 m move goes from lattice
point to lattice point and every point keeps a clearance from the walls. A move is allowed
when the agent's disc fits at the end point and along the way (walls, furniture); the
oracle searches the same moves, so its plans always execute.

What the scene looks like and how it is drawn (headless EGL, textures, meshes) is in
`render.py`, through which this module reaches MiniWorld.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

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
from .render import (
    CEIL_TEXTURES,
    COLOR_NAMES,
    FLOOR_TEXTURES,
    WALL_TEXTURES,
    RenderedWorld,
    entity_size,
    make_entity,
)
from .tasks import KINDS, NavTask, appearance, object_name, write_instruction

LATTICE_OFFSET = 0.25  # lattice points sit this far off the 0.5 m wall grid
AGENT_RADIUS = 0.2
DOOR_WIDTH = 1.0
DOOR_HEIGHT = 2.2
ROOM_SIZES = (3.0, 3.5, 4.0, 4.5, 5.0)
MAX_VIEW_DISTANCE = 12.0
CAMERA_HEIGHT = 1.2  # eye height, metres (MiniWorld's default 1.5 hides objects near the feet)
GENERATION_ATTEMPTS = 60
START_TRIES = 20  # start cells tried per layout for one that sees an object


@dataclass(frozen=True)
class RoomSpec:
    min_x: float
    max_x: float
    min_z: float
    max_z: float
    wall_tex: str
    floor_tex: str
    ceil_tex: str

    def contains(self, x: float, z: float) -> bool:
        return self.min_x <= x <= self.max_x and self.min_z <= z <= self.max_z

    def distance_to(self, x: float, z: float) -> float:
        """Floor distance from (x, z) to the nearest point of this room (0 inside)."""
        dx = max(self.min_x - x, 0.0, x - self.max_x)
        dz = max(self.min_z - z, 0.0, z - self.max_z)
        return math.hypot(dx, dz)


@dataclass(frozen=True)
class DoorSpec:
    room_a: int
    room_b: int
    axis: str  # "z": the shared wall runs along z (rooms side by side in x); "x": along x
    lo: float
    hi: float
    wall: float  # the shared wall's coordinate (x for axis "z", z for axis "x")

    @property
    def center(self) -> tuple[float, float]:
        mid = (self.lo + self.hi) / 2
        return (self.wall, mid) if self.axis == "z" else (mid, self.wall)


@dataclass(frozen=True)
class ObjectSpec:
    id: str
    kind: str
    color: str | None
    x: float
    z: float
    dir: float
    radius: float
    height: float
    room: int

    @property
    def name(self) -> str:
        return object_name(self.kind, self.color)


@dataclass
class Layout:
    rooms: list[RoomSpec]
    doors: list[DoorSpec]
    objects: list[ObjectSpec] = field(default_factory=list)


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


def _segments_cross(p: np.ndarray, q: np.ndarray, a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """For each segment a[k]-b[k] (floor plane, shape (n, 2)): does it cross segment p-q?"""

    def orient(u, v, w):
        return (v[..., 0] - u[..., 0]) * (w[..., 1] - u[..., 1]) - (v[..., 1] - u[..., 1]) * (
            w[..., 0] - u[..., 0]
        )

    d1, d2 = orient(a, b, p), orient(a, b, q)
    d3, d4 = orient(p, q, a), orient(p, q, b)
    return (d1 * d2 < 0) & (d3 * d4 < 0)


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
        self._walls = _wall_segments(layout)
        self._grid = _free_grid(layout, self._walls)

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
        layout, target = _generate_layout(task_set, rng)
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
        where = _where(layout, target)
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
                and not _segments_cross(eye, np.array([o.x, o.z]), walls[:, 0], walls[:, 1]).any()
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


# ---- collision geometry ---------------------------------------------------------------------

GRID_STEP = 0.125  # metres; lattice points and the points checked along a move all lie on it


def _wall_segments(layout: Layout) -> np.ndarray:
    """The rooms' walls with the doorways cut out, as floor segments (n, 2, 2) of (x, z).

    The same walls MiniWorld builds from the layout (rectangles, portals from floor up).
    """
    edges: list[tuple[str, float, float, float]] = []  # (runs along, fixed coord, lo, hi)
    for r in layout.rooms:
        edges += [("x", r.min_z, r.min_x, r.max_x), ("x", r.max_z, r.min_x, r.max_x)]
        edges += [("z", r.min_x, r.min_z, r.max_z), ("z", r.max_x, r.min_z, r.max_z)]
    segments = []
    for axis, fixed, lo, hi in edges:
        pieces = [(lo, hi)]
        for d in layout.doors:
            if d.axis == axis and math.isclose(d.wall, fixed):
                pieces = [
                    part
                    for a, b in pieces
                    for part in ((a, min(b, d.lo)), (max(a, d.hi), b))
                    if part[1] - part[0] > 1e-9
                ]
        for a, b in pieces:
            segments.append(((a, fixed), (b, fixed)) if axis == "x" else ((fixed, a), (fixed, b)))
    return np.array(segments, dtype=float).reshape(-1, 2, 2)


def _free_grid(layout: Layout, walls: np.ndarray) -> np.ndarray:
    """free[i, j]: the agent's disc at (i, j) * GRID_STEP touches no wall and no object.

    Same test as MiniWorld's `intersect` (distance < radius collides), vectorised.
    """
    max_x = max(r.max_x for r in layout.rooms)
    max_z = max(r.max_z for r in layout.rooms)
    xs = np.arange(0, round(max_x / GRID_STEP) + 1) * GRID_STEP
    zs = np.arange(0, round(max_z / GRID_STEP) + 1) * GRID_STEP
    px, pz = np.meshgrid(xs, zs, indexing="ij")
    points = np.stack([px.ravel(), pz.ravel()], axis=1)  # (n, 2)
    a, b = walls[:, 0], walls[:, 1]  # (m, 2)
    ab = b - a
    t = np.clip(((points[:, None, :] - a) * ab).sum(-1) / (ab * ab).sum(-1), 0.0, 1.0)
    closest = a + t[..., None] * ab
    free = np.linalg.norm(points[:, None, :] - closest, axis=-1).min(axis=1) >= AGENT_RADIUS
    for o in layout.objects:
        free &= np.hypot(points[:, 0] - o.x, points[:, 1] - o.z) >= AGENT_RADIUS + o.radius
    inside = np.zeros(len(points), dtype=bool)
    for r in layout.rooms:
        inside |= (
            (points[:, 0] >= r.min_x) & (points[:, 0] <= r.max_x)
            & (points[:, 1] >= r.min_z) & (points[:, 1] <= r.max_z)
        )  # fmt: skip
    return (free & inside).reshape(len(xs), len(zs))


# ---- procedural generation -----------------------------------------------------------------


def _choice(rng: np.random.Generator, options):
    return options[int(rng.integers(len(options)))]


def _generate_rooms(task_set: str, rng: np.random.Generator) -> Layout:
    if task_set == "long_horizon":
        shapes = ((1, 2), (2, 1), (1, 3), (3, 1), (2, 2))
    else:
        shapes = ((1, 1), (1, 1), (1, 2), (2, 1), (2, 2))
    rows, cols = _choice(rng, shapes)
    widths = [_choice(rng, ROOM_SIZES) for _ in range(cols)]
    depths = [_choice(rng, ROOM_SIZES) for _ in range(rows)]
    rooms = []
    for r in range(rows):
        for c in range(cols):
            rooms.append(
                RoomSpec(
                    min_x=sum(widths[:c]),
                    max_x=sum(widths[: c + 1]),
                    min_z=sum(depths[:r]),
                    max_z=sum(depths[: r + 1]),
                    wall_tex=_choice(rng, WALL_TEXTURES),
                    floor_tex=_choice(rng, FLOOR_TEXTURES),
                    ceil_tex=_choice(rng, CEIL_TEXTURES),
                )
            )
    pairs = [(r * cols + c, r * cols + c + 1) for r in range(rows) for c in range(cols - 1)]
    pairs += [(r * cols + c, (r + 1) * cols + c) for r in range(rows - 1) for c in range(cols)]
    if len(pairs) == 4 and rng.random() < 0.5:  # a 2x2 house: sometimes a loop, sometimes not
        pairs.pop(int(rng.integers(4)))
    doors = []
    for a, b in pairs:
        ra, rb = rooms[a], rooms[b]
        if ra.max_x == rb.min_x:  # side by side: the shared wall runs along z
            axis, wall, lo, hi = "z", ra.max_x, ra.min_z, ra.max_z
        else:
            axis, wall, lo, hi = "x", ra.max_z, ra.min_x, ra.max_x
        slots = int((hi - lo - DOOR_WIDTH - 1.0) / STEP_METRES) + 1
        start = lo + 0.5 + STEP_METRES * int(rng.integers(slots))
        doors.append(DoorSpec(a, b, axis, start, start + DOOR_WIDTH, wall))
    return Layout(rooms, doors)


def _pick_target(task_set: str, rng: np.random.Generator) -> tuple[str, str | None]:
    if task_set == "visual_appearance":
        kinds = [k for k in KINDS.values() if k.colored]
    elif task_set == "common_sense":
        kinds = [k for k in KINDS.values() if k.use]
    else:
        kinds = list(KINDS.values())
    kind = _choice(rng, kinds)
    return kind.name, (_choice(rng, COLOR_NAMES) if kind.colored else None)


def _place(
    layout: Layout, rng: np.random.Generator, kind: str, color: str | None, room: int
) -> ObjectSpec | None:
    r = layout.rooms[room]
    radius, height = entity_size(kind, color)
    for _ in range(100):
        x = float(rng.uniform(r.min_x + radius + 0.15, r.max_x - radius - 0.15))
        z = float(rng.uniform(r.min_z + radius + 0.15, r.max_z - radius - 0.15))
        if any(math.dist((x, z), d.center) < radius + 1.0 for d in layout.doors):
            continue
        if any(math.dist((x, z), (o.x, o.z)) < radius + o.radius + 0.5 for o in layout.objects):
            continue
        obj = ObjectSpec(
            id=f"{object_name(kind, color).replace(' ', '_')}_{len(layout.objects)}",
            kind=kind,
            color=color,
            x=round(x, 3),
            z=round(z, 3),
            dir=round(float(rng.uniform(-math.pi, math.pi)), 3),
            radius=radius,
            height=height,
            room=room,
        )
        layout.objects.append(obj)
        return obj
    return None


def _generate_layout(task_set: str, rng: np.random.Generator) -> tuple[Layout, ObjectSpec | None]:
    """Rooms, doors and furniture; returns the layout and its target object."""
    layout = _generate_rooms(task_set, rng)
    n_rooms = len(layout.rooms)
    target_room = int(rng.integers(n_rooms))
    kind, color = _pick_target(task_set, rng)
    target = _place(layout, rng, kind, color, target_room)
    if target is None:
        return layout, None
    names = {target.name}
    categories = {KINDS[kind].category}
    if task_set == "visual_appearance":  # look-alikes of other colours next to the target
        others = [c for c in COLOR_NAMES if c != color]
        for c in rng.choice(others, size=int(rng.integers(1, 3)), replace=False):
            if _place(layout, rng, kind, str(c), target_room) is not None:
                names.add(object_name(kind, str(c)))
    for room in range(n_rooms):
        r = layout.rooms[room]
        area = (r.max_x - r.min_x) * (r.max_z - r.min_z)
        count = int(rng.integers(2, 4)) + (1 if area >= 16 else 0)
        for _ in range(count):
            k = _choice(rng, list(KINDS))
            c = _choice(rng, COLOR_NAMES) if KINDS[k].colored else None
            if object_name(k, c) in names:
                continue
            if task_set == "common_sense" and KINDS[k].category in categories:
                continue  # the target's description must fit one object only
            if _place(layout, rng, k, c, room) is not None:
                names.add(object_name(k, c))
    return layout, target


def _where(layout: Layout, target: ObjectSpec) -> str:
    """' near the doorway' / ' next to the barrel' / '' for appearance instructions."""
    if any(math.dist((target.x, target.z), d.center) < 2.0 for d in layout.doors):
        return " near the doorway"
    others = [o for o in layout.objects if o.id != target.id and o.room == target.room]
    if others:
        nearest = min(others, key=lambda o: math.dist((o.x, o.z), (target.x, target.z)))
        if math.dist((nearest.x, nearest.z), (target.x, target.z)) < 2.0:
            return f" next to the {nearest.name}"
    return ""
