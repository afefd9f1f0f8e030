"""The observation images: the target icon and the agent's last rendering.

Both are SVG documents rasterised at the configured image size, on white, through the
sandboxed rasteriser (`rasterize.py`); an answer that could not be rendered is shown as
an empty canvas.
"""

from __future__ import annotations

import numpy as np

from .rasterize import Limits, render_svg


def picture(svg: str, limits: Limits, size: int) -> np.ndarray:
    """`svg` rasterised to a size x size RGB uint8 image; InvalidSvg when it is refused."""
    return render_svg(svg, limits, size, size)


def empty_canvas(like: np.ndarray) -> np.ndarray:
    """The white canvas shown in place of an answer that could not be rendered."""
    return np.full_like(like, 255)
