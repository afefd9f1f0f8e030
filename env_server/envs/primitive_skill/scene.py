"""The ManiSkill3 side: one tabletop scene with a Panda arm, built from code.

`TabletopScene` is a ManiSkill `BaseEnv` with the stock table and Panda (shipped with
the package, no download), a third-person render camera and whatever the task builds
(cubes, goal discs, an apple and a drawer articulation). It holds no task logic: a
`Task` (tasks.py) builds its objects into it and places them from a layout sampled
with the episode's seed. The camera and the image it gives are in `render.py`.

This module imports mani_skill/sapien; the rest of the package imports it lazily.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np
import sapien
import torch
from mani_skill.envs.sapien_env import BaseEnv
from mani_skill.sensors.camera import CameraConfig
from mani_skill.utils.scene_builder.table import TableSceneBuilder

from . import render

if TYPE_CHECKING:
    from .tasks import Task


class TabletopScene(BaseEnv):
    """Table, Panda (end-effector pose control) and the task's objects; CPU physics."""

    SUPPORTED_ROBOTS = ["panda"]
    SUPPORTED_REWARD_MODES = ("none",)

    def __init__(self, task: Task, image_size: int = 300, **kwargs: Any) -> None:
        self.task = task
        self.image_size = image_size
        self.layout: dict[str, Any] = {}  # set by the caller before each reset
        super().__init__(
            robot_uids="panda",
            obs_mode="none",
            reward_mode="none",
            control_mode="pd_ee_pose",
            render_mode="rgb_array",
            sim_backend="physx_cpu",
            render_backend="cpu",
            **kwargs,
        )

    # ---- cameras ------------------------------------------------------------
    @property
    def _default_sensor_configs(self) -> list[CameraConfig]:
        return []

    @property
    def _default_human_render_camera_configs(self) -> CameraConfig:
        return render.camera(self.image_size)

    # ---- scene --------------------------------------------------------------
    def _load_agent(self, options: dict) -> None:
        super()._load_agent(options, sapien.Pose(p=[-0.615, 0, 0]))

    def _load_scene(self, options: dict) -> None:
        self.table_scene = TableSceneBuilder(env=self, robot_init_qpos_noise=0.0)
        self.table_scene.build()
        self.task.build(self.scene)

    def _initialize_episode(self, env_idx: torch.Tensor, options: dict) -> None:
        with torch.device(self.device):
            self.table_scene.initialize(env_idx)
            if self.layout:  # empty while ManiSkill builds the scene
                self.task.initialize(self.layout)

    def evaluate(self) -> dict:
        return {}  # success and stages are judged by the task, outside the simulator loop

    def compute_dense_reward(self, obs: Any, action: torch.Tensor, info: dict) -> torch.Tensor:
        return torch.zeros(self.num_envs, device=self.device)

    # ---- helpers used by the controller and the tasks --------------------------
    def render_rgb(self) -> np.ndarray:
        """The observation image (see `render.py`)."""
        return render.to_rgb(self.render())
