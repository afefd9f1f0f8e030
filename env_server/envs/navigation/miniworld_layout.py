"""The MiniWorld backend's scenes: the layout types and their procedural generation.

A `Layout` is rooms (axis-aligned rectangles whose walls lie on multiples of 0.5 m),
the doors between them and the furniture in them; `generate_layout` draws one for a
task set (its target among the furniture), and `where_phrase` says where the target is
for an instruction. What the scene looks like (textures, meshes, colours) is `render.py`'s.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from .backend import STEP_METRES
from .render import CEIL_TEXTURES, COLOR_NAMES, FLOOR_TEXTURES, WALL_TEXTURES, entity_size
from .tasks import KINDS, object_name

DOOR_WIDTH = 1.0
ROOM_SIZES = (3.0, 3.5, 4.0, 4.5, 5.0)


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


def generate_layout(task_set: str, rng: np.random.Generator) -> tuple[Layout, ObjectSpec | None]:
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


def where_phrase(layout: Layout, target: ObjectSpec) -> str:
    """' near the doorway' / ' next to the barrel' / '' for appearance instructions."""
    if any(math.dist((target.x, target.z), d.center) < 2.0 for d in layout.doors):
        return " near the doorway"
    others = [o for o in layout.objects if o.id != target.id and o.room == target.room]
    if others:
        nearest = min(others, key=lambda o: math.dist((o.x, o.z), (target.x, target.z)))
        if math.dist((nearest.x, nearest.z), (target.x, target.z)) < 2.0:
            return f" next to the {nearest.name}"
    return ""
