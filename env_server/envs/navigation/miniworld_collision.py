"""The MiniWorld backend's collision geometry, computed from a layout (no rendering).

The rooms' walls with the doorways cut out (`wall_segments`), the grid of points where the
agent's disc touches no wall and no object (`free_grid`), and whether a line of sight
crosses a wall (`segments_cross`).
"""

from __future__ import annotations

import math

import numpy as np

from .miniworld_layout import Layout

AGENT_RADIUS = 0.2
GRID_STEP = 0.125  # metres; lattice points and the points checked along a move all lie on it


def wall_segments(layout: Layout) -> np.ndarray:
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


def free_grid(layout: Layout, walls: np.ndarray) -> np.ndarray:
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


def segments_cross(p: np.ndarray, q: np.ndarray, a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """For each segment a[k]-b[k] (floor plane, shape (n, 2)): does it cross segment p-q?"""

    def orient(u, v, w):
        return (v[..., 0] - u[..., 0]) * (w[..., 1] - u[..., 1]) - (v[..., 1] - u[..., 1]) * (
            w[..., 0] - u[..., 0]
        )

    d1, d2 = orient(a, b, p), orient(a, b, q)
    d3, d4 = orient(p, q, a), orient(p, q, b)
    return (d1 * d2 < 0) & (d3 * d4 < 0)
