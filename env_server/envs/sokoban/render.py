"""A fast Sokoban renderer: tiles drawn once per tile size, a room's still background
composed once per episode, and each frame a copy of it with the moving tiles painted on.

Each tile kind has its own colour and shape so that a vision model can tell them
apart: brick walls, plain floor, a red ring for a target, a wooden crate with a cross
for a box, a green crate for a box on a target, a blue figure for the player.
"""

from __future__ import annotations

from functools import lru_cache

import numpy as np

from .level import Level

# tile indices
WALL, FLOOR, TARGET, BOX, BOX_ON_TARGET, PLAYER, PLAYER_ON_TARGET = range(7)

_WALL = (112, 66, 48)
_MORTAR = (168, 140, 120)
_FLOOR = (214, 210, 196)
_FLOOR_EDGE = (190, 186, 172)
_TARGET = (214, 40, 40)
_BOX = (201, 132, 48)
_BOX_DARK = (120, 72, 20)
_BOX_DONE = (58, 170, 70)
_BOX_DONE_DARK = (22, 96, 34)
_PLAYER = (40, 90, 220)
_PLAYER_DARK = (16, 40, 120)


def _grid(size: int) -> tuple[np.ndarray, np.ndarray]:
    """Pixel-centre coordinates in [0, 1] for a size x size tile."""
    coords = (np.arange(size) + 0.5) / size
    return np.meshgrid(coords, coords, indexing="ij")


def _floor(size: int) -> np.ndarray:
    tile = np.empty((size, size, 3), dtype=np.uint8)
    tile[:] = _FLOOR
    tile[-1, :] = _FLOOR_EDGE
    tile[:, -1] = _FLOOR_EDGE
    return tile


def _wall(size: int) -> np.ndarray:
    tile = np.empty((size, size, 3), dtype=np.uint8)
    tile[:] = _WALL
    row_h = max(size // 4, 1)
    for i, top in enumerate(range(0, size, row_h)):
        tile[top, :] = _MORTAR  # horizontal mortar line
        shift = 0 if i % 2 == 0 else size // 2
        for x in (shift, (shift + size // 2) % size):
            tile[top : top + row_h, x] = _MORTAR  # staggered vertical joints
    return tile


def _ring(tile: np.ndarray, colour: tuple[int, int, int]) -> np.ndarray:
    y, x = _grid(tile.shape[0])
    r = np.hypot(y - 0.5, x - 0.5)
    width = max(1.5 / tile.shape[0], 0.08)
    tile[(r > 0.36 - width) & (r < 0.36 + width)] = colour
    tile[r < 0.1] = colour  # centre dot
    return tile


def _crate(tile: np.ndarray, fill: tuple[int, int, int], dark: tuple[int, int, int]) -> np.ndarray:
    size = tile.shape[0]
    y, x = _grid(size)
    inside = (y > 0.1) & (y < 0.9) & (x > 0.1) & (x < 0.9)
    tile[inside] = dark
    inner = (y > 0.18) & (y < 0.82) & (x > 0.18) & (x < 0.82)
    tile[inner] = fill
    band = max(1.0 / size, 0.06)
    cross = inner & ((np.abs(y - x) < band) | (np.abs(y + x - 1) < band))
    tile[cross] = dark
    return tile


def _figure(tile: np.ndarray) -> np.ndarray:
    y, x = _grid(tile.shape[0])
    head = np.hypot(y - 0.28, x - 0.5) < 0.16
    body = ((y - 0.68) / 0.26) ** 2 + ((x - 0.5) / 0.3) ** 2 < 1.0
    tile[body] = _PLAYER
    tile[head] = _PLAYER_DARK
    return tile


@lru_cache(maxsize=8)
def tiles(size: int) -> np.ndarray:
    """All tile images for `size` pixels, shape (7, size, size, 3), read-only."""
    out = np.stack(
        [
            _wall(size),
            _floor(size),
            _ring(_floor(size), _TARGET),
            _crate(_floor(size), _BOX, _BOX_DARK),
            _crate(_ring(_floor(size), _TARGET), _BOX_DONE, _BOX_DONE_DARK),
            _figure(_floor(size)),
            _figure(_ring(_floor(size), _TARGET)),
        ]
    )
    out.flags.writeable = False
    return out


def compose(cells: np.ndarray, size: int) -> np.ndarray:
    """The RGB frame for a (rows, cols) grid of tile indices."""
    rows, cols = cells.shape
    frame = tiles(size)[cells]  # (rows, cols, size, size, 3)
    return frame.transpose(0, 2, 1, 3, 4).reshape(rows * size, cols * size, 3)


def background(level: Level, size: int) -> np.ndarray:
    """The frame of everything in `level` that never changes (walls, floor, targets),
    composed once per episode; read-only."""
    cells = np.full(level.height * level.width, FLOOR, dtype=np.intp)
    cells[list(level.walls)] = WALL
    cells[list(level.targets)] = TARGET
    out = compose(cells.reshape(level.height, level.width), size)
    out.flags.writeable = False
    return out


def frame(level: Level, still: np.ndarray, size: int) -> np.ndarray:
    """The frame of `level`: a copy of its `background` with the boxes and the player
    drawn on their cells. (rows * size, cols * size, 3) uint8."""
    out = still.copy()
    drawn = tiles(size)
    for cell in level.boxes:
        _paint(out, level, cell, drawn[BOX_ON_TARGET if cell in level.targets else BOX], size)
    player = level.player
    _paint(out, level, player, drawn[PLAYER_ON_TARGET if player in level.targets else PLAYER], size)
    return out


def _paint(out: np.ndarray, level: Level, cell: int, tile: np.ndarray, size: int) -> None:
    r, c = divmod(cell, level.width)
    out[r * size : (r + 1) * size, c * size : (c + 1) * size] = tile
