"""The observation image: the tabletop seen by a third-person camera.

The camera of the paper's setup stands across the table from the robot and looks back at
it; ManiSkill renders it through SAPIEN (any Vulkan device, Mesa lavapipe on CPU-only
machines). `scene.py` mounts the camera; this module says where it is and turns a frame
into the RGB array an observation carries.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
from mani_skill.sensors.camera import CameraConfig
from mani_skill.utils import sapien_utils

# across the table from the robot, looking back at it and 45 degrees down onto the
# workspace (x -0.1..0.15 m, y -0.2..0.2 m, all in view, the gripper's start too): the
# table fills the frame (no black sky over its top) and a 4 cm cube is ~25 px of 300
CAMERA_EYE = (0.5, 0.0, 0.55)
CAMERA_TARGET = (-0.05, 0.0, 0.0)
CAMERA_FOV = 1.0  # radians


def camera(image_size: int) -> CameraConfig:
    """The render camera, square images of `image_size` pixels."""
    pose = sapien_utils.look_at(eye=list(CAMERA_EYE), target=list(CAMERA_TARGET))
    return CameraConfig("render_camera", pose, image_size, image_size, CAMERA_FOV, 0.01, 100)


def camera_info(image_size: int) -> dict[str, Any]:
    """The render camera in the observation's info (metres, radians, pixels): the play
    page turns a click on the image into table coordinates with it."""
    return {"eye_m": list(CAMERA_EYE), "target_m": list(CAMERA_TARGET), "fov_rad": CAMERA_FOV,
            "size_px": image_size}  # fmt: skip


def to_rgb(frame: Any) -> np.ndarray:
    """A rendered frame (tensor or array, batched or not) as one RGB uint8 image."""
    if isinstance(frame, torch.Tensor):
        frame = frame.cpu().numpy()
    return np.ascontiguousarray(frame[0] if frame.ndim == 4 else frame, dtype=np.uint8)
