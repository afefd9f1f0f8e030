"""FrozenLake's observation image: gymnasium's own picture of the lake (drawn with
pygame), resized when the config asks for another size."""

from __future__ import annotations

import os

import numpy as np
from gymnasium.envs.toy_text.frozen_lake import FrozenLakeEnv as GymFrozenLake
from PIL import Image

# pygame (imported by gymnasium at the first render) must find a display driver it can
# open headless
os.environ.setdefault("SDL_VIDEODRIVER", "dummy")
os.environ.setdefault("PYGAME_HIDE_SUPPORT_PROMPT", "1")


def frame(gym: GymFrozenLake, side: int | None) -> np.ndarray:
    """The current frame, (side, side, 3) uint8 (gymnasium's 64 px per cell when None)."""
    image = gym.render()
    if side is not None and image.shape[:2] != (side, side):
        image = np.asarray(Image.fromarray(image).resize((side, side), Image.Resampling.LANCZOS))
    return image
