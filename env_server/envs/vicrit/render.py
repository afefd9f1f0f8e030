"""Vicrit's observation image: the scene (a source environment's frame or a JSONL
item's picture) scaled to the configured size."""

from __future__ import annotations

import numpy as np
from PIL import Image


def sized(image: np.ndarray, side: int) -> np.ndarray:
    """`image` scaled so that its longer side is `side` (nearest: pixel art stays sharp)."""
    h, w = image.shape[:2]
    if max(h, w) == side:
        return image
    scale = side / max(h, w)
    size = (max(1, round(w * scale)), max(1, round(h * scale)))
    return np.asarray(Image.fromarray(image).resize(size, Image.Resampling.NEAREST))
