"""The first-person image of the MiniWorld backend: headless OpenGL, textures, objects.

Rendering goes through pyglet's headless (EGL) mode, which must be chosen before pyglet's
GL module is imported: this module sets it before importing MiniWorld, and the backend
reaches MiniWorld only through it. What the rooms and objects look like (textures,
meshes, colours) is chosen here; where they are is `miniworld_layout.py`'s business.
(The AI2-THOR backend's image is Unity's frame, see `ai2thor_backend.py`.)
"""

from __future__ import annotations

import contextlib
import io
from ctypes import byref
from dataclasses import dataclass
from typing import Any

import pyglet
from PIL import Image

pyglet.options["headless"] = True

from miniworld.entity import COLORS, Box, MeshEnt  # noqa: E402
from miniworld.miniworld import MiniWorldEnv  # noqa: E402
from miniworld.opengl import Texture  # noqa: E402
from pyglet.gl import (  # noqa: E402
    GL_AMBIENT,
    GL_AMBIENT_AND_DIFFUSE,
    GL_COLOR_MATERIAL,
    GL_COMPILE,
    GL_DIFFUSE,
    GL_FRONT_AND_BACK,
    GL_LIGHT0,
    GL_LIGHTING,
    GL_LINEAR,
    GL_LINEAR_MIPMAP_LINEAR,
    GL_POSITION,
    GL_RGB,
    GL_RGBA,
    GL_SMOOTH,
    GL_TEXTURE_2D,
    GL_TEXTURE_MAG_FILTER,
    GL_TEXTURE_MIN_FILTER,
    GL_UNSIGNED_BYTE,
    GLfloat,
    GLuint,
    glBindTexture,
    glCallList,
    glColorMaterial,
    glEnable,
    glEndList,
    glGenerateMipmap,
    glGenLists,
    glGenTextures,
    glLightfv,
    glNewList,
    glShadeModel,
    glTexImage2D,
    glTexParameteri,
)

WALL_TEXTURES = (
    "brick_wall",
    "concrete",
    "drywall",
    "stucco",
    "cinder_blocks",
    "wood_planks",
    "marble",
)
FLOOR_TEXTURES = (
    "floor_tiles_bw",
    "wood",
    "wood_planks",
    "concrete_tiles",
    "marble",
)
CEIL_TEXTURES = ("ceiling_tiles", "ceiling_tile_noborder", "concrete_tiles", "white")
COLOR_NAMES = tuple(sorted(COLORS))
# mesh name and height (m) of each uncoloured kind; colored kinds are built in `make_entity`
MESHES = {
    "chair": ("office_chair", 1.0),
    "desk": ("office_desk", 0.8),
    "barrel": ("barrel", 1.0),
    "cone": ("cone", 0.7),
    "duckie": ("duckie", 0.4),
    "medkit": ("medkit", 0.4),
    "potion": ("potion", 0.4),
    "keycard": ("keycard", 0.35),
}


# ---- textures ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class _GLTexture:
    id: int
    width: int
    height: int
    target: int = GL_TEXTURE_2D


def _load_texture(path: str) -> _GLTexture:
    """Upload a PNG as a mipmapped texture, decoded by Pillow.

    MiniWorld's own `Texture.load` converts pixels through pyglet's pure-Python regex path,
    which takes seconds per texture on a small CPU; this does the same upload in
    milliseconds (rows bottom-up, as OpenGL and pyglet expect).
    """
    img = Image.open(path).convert("RGBA").transpose(Image.Transpose.FLIP_TOP_BOTTOM)
    tex_id = GLuint(0)
    glGenTextures(1, byref(tex_id))
    glBindTexture(GL_TEXTURE_2D, tex_id)
    glTexImage2D(
        GL_TEXTURE_2D, 0, GL_RGB, img.width, img.height, 0, GL_RGBA, GL_UNSIGNED_BYTE, img.tobytes()
    )
    glGenerateMipmap(GL_TEXTURE_2D)
    glTexParameteri(GL_TEXTURE_2D, GL_TEXTURE_MAG_FILTER, GL_LINEAR)
    glTexParameteri(GL_TEXTURE_2D, GL_TEXTURE_MIN_FILTER, GL_LINEAR_MIPMAP_LINEAR)
    glBindTexture(GL_TEXTURE_2D, 0)
    return _GLTexture(tex_id.value, img.width, img.height)


Texture.load = classmethod(lambda cls, path: _load_texture(path))


# ---- objects ----------------------------------------------------------------------------------


def make_entity(kind: str, color: str | None) -> Any:
    """The MiniWorld entity that draws an object of `kind` (and `color`, where it has one)."""
    if kind == "box":
        return Box(color=color, size=0.6)
    if kind == "ball":
        return MeshEnt(f"ball_{color}", height=0.5, static=True)
    if kind == "key":
        return MeshEnt(f"key_{color}", height=0.35, static=True)
    mesh, height = MESHES[kind]
    return MeshEnt(mesh, height=height, static=True)


_SIZE_CACHE: dict[tuple[str, str | None], tuple[float, float]] = {}


def entity_size(kind: str, color: str | None) -> tuple[float, float]:
    """(radius, height) of an object's bounding cylinder as drawn, metres."""
    key = (kind, color)
    if key not in _SIZE_CACHE:
        ent = make_entity(kind, color)
        _SIZE_CACHE[key] = float(ent.radius), float(ent.height)
    return _SIZE_CACHE[key]


# ---- the world's picture ----------------------------------------------------------------------


class RenderedWorld(MiniWorldEnv):
    """A MiniWorld env that renders `image_size` x `image_size` views headless.

    MiniWorld compiles the static scene into display list 1, which all contexts of a
    process share; each world here uses its own list so that many worlds can live in one
    process. Subclasses build the scene (`_gen_world`); `render_obs()` is the agent's view.
    """

    def __init__(self, image_size: int) -> None:
        self._list_id = 0
        with contextlib.redirect_stdout(io.StringIO()):  # MiniWorld prints sample fallbacks
            super().__init__(
                max_episode_steps=1 << 30,
                obs_width=image_size,
                obs_height=image_size,
                window_width=1,
                window_height=1,
            )

    def _render_static(self) -> None:
        self.shadow_window.switch_to()
        if not self._list_id:
            self._list_id = glGenLists(1)
        glNewList(self._list_id, GL_COMPILE)
        glLightfv(GL_LIGHT0, GL_POSITION, (GLfloat * 4)(*self.light_pos, 1))
        glLightfv(GL_LIGHT0, GL_AMBIENT, (GLfloat * 4)(*self.light_ambient))
        glLightfv(GL_LIGHT0, GL_DIFFUSE, (GLfloat * 4)(*self.light_color))
        glEnable(GL_LIGHTING)
        glEnable(GL_LIGHT0)
        glShadeModel(GL_SMOOTH)
        glEnable(GL_COLOR_MATERIAL)
        glColorMaterial(GL_FRONT_AND_BACK, GL_AMBIENT_AND_DIFFUSE)
        glEnable(GL_TEXTURE_2D)
        for room in self.rooms:
            room._render()
        for ent in self.entities:
            if ent.is_static:
                ent.render()
        glEndList()

    def _render_world(self, frame_buffer, render_agent):
        glCallList(self._list_id)
        for ent in self.entities:
            if not ent.is_static and ent is not self.agent:
                ent.render()
        return frame_buffer.resolve()
