"""AI2-THOR backend (ai2thor 5.x, iTHOR FloorPlan scenes), written against its documented API.

ai2thor downloads its Unity build the first time a `Controller` starts. Where that build is
not on the machine (and downloading is not allowed), creating a session fails at once with
EnvError(UNAVAILABLE) saying how to provide one:

- point `$VISENV_AI2THOR_EXECUTABLE` at a local build's executable, or
- copy a downloaded `~/.ai2thor/releases/thor-<platform>-<commit>/` onto the machine, or
- allow the download with `VISENV_AI2THOR_ALLOW_DOWNLOAD=1` on a machine with internet access.

Task files of the paper's shape are read from `$VISENV_AI2THOR_TASK_DIR` (config
`ai2thor_task_file` names one there) or given inline (config `ai2thor_tasks`). These
settings are environment variables because they are the server operator's choice: a
remote client must not pick which program the server runs or which files it reads.

`ai2thor` itself is imported lazily, so this module loads (task files, action mapping) even
where it is not installed.
"""

from __future__ import annotations

import importlib
import math
import os
from pathlib import Path
from typing import Any, Protocol

import numpy as np

from env_server.core import EnvError

from . import planner
from .backend import LOOK_DEGREES, ROTATE_DEGREES, STEP_METRES, Backend, BackendSettings
from .geometry import ObjectState, Pose
from .tasks import NavTask, load_task_file, parse_tasks, write_instruction

EXECUTABLE_ENV = "VISENV_AI2THOR_EXECUTABLE"
DOWNLOAD_ENV = "VISENV_AI2THOR_ALLOW_DOWNLOAD"
TASK_DIR_ENV = "VISENV_AI2THOR_TASK_DIR"
VISIBILITY_DISTANCE = 10.0
GRID_SIZE = 0.25

# our action names -> AI2-THOR controller.step arguments
ACTION_MAP: dict[str, dict[str, Any]] = {
    "moveahead": {"action": "MoveAhead", "moveMagnitude": STEP_METRES},
    "moveback": {"action": "MoveBack", "moveMagnitude": STEP_METRES},
    "moveleft": {"action": "MoveLeft", "moveMagnitude": STEP_METRES},
    "moveright": {"action": "MoveRight", "moveMagnitude": STEP_METRES},
    "rotateleft": {"action": "RotateLeft", "degrees": ROTATE_DEGREES},
    "rotateright": {"action": "RotateRight", "degrees": ROTATE_DEGREES},
    "lookup": {"action": "LookUp", "degrees": LOOK_DEGREES},
    "lookdown": {"action": "LookDown", "degrees": LOOK_DEGREES},
}

# what generated (not file-given) tasks may ask for, with common-sense and appearance phrases
THOR_TARGETS: dict[str, tuple[str, str]] = {
    "Bread": ("freshly baked loaves for sandwiches", "rectangular golden-brown loaf"),
    "Pot": ("a large container to boil pasta in", "round dark cooking vessel"),
    "Apple": ("a crunchy fruit for a snack", "small round red fruit"),
    "Television": ("something to watch the news on", "large flat black screen"),
    "Laptop": ("a portable computer to check my email", "thin folding computer"),
    "Sofa": ("somewhere comfortable for several people to sit", "long upholstered couch"),
    "Bed": ("somewhere to sleep", "large mattress with bedding"),
    "Toilet": ("the place to relieve yourself", "white porcelain bowl with a lid"),
    "Sink": ("somewhere to wash my hands", "basin with a faucet"),
    "Fridge": ("where the food is kept cold", "tall white appliance with a door"),
    "Mug": ("something to drink coffee from", "small cup with a handle"),
    "Chair": ("something you can sit on", "seat with four legs and a back"),
}


class ThorOptions(Protocol):
    """The AI2-THOR options of a session, read-only (NavigationConfig has them all)."""

    @property
    def task_set(self) -> str: ...
    @property
    def ai2thor_platform(self) -> str: ...
    @property
    def ai2thor_task_file(self) -> str | None: ...
    @property
    def ai2thor_tasks(self) -> dict[str, Any] | None: ...
    @property
    def ai2thor_scenes(self) -> list[str]: ...


def thor_pose(position: dict[str, float], yaw: float, horizon: float) -> Pose:
    """A Pose from AI2-THOR's metadata (Unity: y up, yaw clockwise from +z seen from above)."""
    a = math.radians(yaw)
    return Pose(
        x=float(position["x"]),
        z=float(position["z"]),
        forward=(math.sin(a), math.cos(a)),
        right=(math.cos(a), -math.sin(a)),
        heading=yaw,
        horizon=horizon,
    )


def find_build(cfg: ThorOptions) -> str | None:
    """The local executable to run, None to let ai2thor find its own build.

    Raises EnvError(UNAVAILABLE) right away when no build can be had.
    """
    try:
        importlib.import_module("ai2thor")
    except ImportError as exc:
        raise EnvError(
            f"the ai2thor backend needs the ai2thor package ({exc}): pip install 'visenv[ai2thor]'",
            code="UNAVAILABLE",
        ) from exc
    if cfg.ai2thor_platform == "Linux64" and not os.environ.get("DISPLAY"):
        raise EnvError(
            "ai2thor_platform 'Linux64' needs an X display ($DISPLAY is not set); "
            "use 'CloudRendering' (Vulkan) or start an X server",
            code="UNAVAILABLE",
        )
    executable = os.environ.get(EXECUTABLE_ENV)
    if executable:
        path = Path(executable).expanduser()
        if not (path.is_file() and os.access(path, os.X_OK)):
            raise EnvError(
                f"the AI2-THOR executable {str(path)!r} (from ${EXECUTABLE_ENV}) "
                "does not exist or is not executable",
                code="UNAVAILABLE",
            )
        return str(path)
    build = importlib.import_module("ai2thor.build")
    release = (
        Path.home()
        / ".ai2thor"
        / "releases"
        / build.build_name(cfg.ai2thor_platform, build.COMMIT_ID)
    )
    if release.is_dir() or os.environ.get(DOWNLOAD_ENV, "") in ("1", "true", "yes"):
        return None
    raise EnvError(
        "AI2-THOR's Unity build is not on this machine and ai2thor would download it at run "
        f"time ({release} is missing). To provide one, the server's operator sets "
        f"${EXECUTABLE_ENV} to a local build's executable, copies a downloaded "
        f"{release.name}/ into ~/.ai2thor/releases/, or sets {DOWNLOAD_ENV}=1 on a machine "
        "with internet access. The MiniWorld backend (backend: 'miniworld') runs here.",
        code="UNAVAILABLE",
    )


def given_tasks(cfg: ThorOptions) -> list[NavTask] | None:
    """Tasks from the config (inline, or a file in the server's task folder), else None."""
    if cfg.ai2thor_tasks is not None:
        return parse_tasks(cfg.ai2thor_tasks, "config ai2thor_tasks", cfg.task_set)
    if cfg.ai2thor_task_file is None:
        return None
    folder = os.environ.get(TASK_DIR_ENV)
    if not folder:
        raise EnvError(
            f"this server reads no task files (${TASK_DIR_ENV} is not set); "
            "give the tasks inline in ai2thor_tasks",
            code="INVALID_ARGUMENT",
        )
    name = cfg.ai2thor_task_file
    if Path(name).name != name or name in (".", ".."):
        raise EnvError(
            f"ai2thor_task_file must be a file name inside the server's task folder, got {name!r}",
            code="INVALID_ARGUMENT",
        )
    path = Path(folder) / name
    if not path.is_file():
        available = sorted(p.name for p in Path(folder).glob("*.json"))
        raise EnvError(
            f"no task file {name!r} on this server; available: {', '.join(available) or 'none'}",
            code="INVALID_ARGUMENT",
        )
    return load_task_file(path, cfg.task_set)


class AI2ThorBackend(Backend):
    def __init__(self, settings: BackendSettings, cfg: ThorOptions) -> None:
        self.settings = settings
        self.cfg = cfg
        self.controller: Any = None
        self.file_tasks = given_tasks(cfg)
        executable = find_build(cfg)  # fails at once when there is no build
        controller_mod = importlib.import_module("ai2thor.controller")
        platform_mod = importlib.import_module("ai2thor.platform")
        kwargs: dict[str, Any] = {
            "agentMode": "default",
            "gridSize": GRID_SIZE,
            "rotateStepDegrees": ROTATE_DEGREES,
            "visibilityDistance": VISIBILITY_DISTANCE,
            "fieldOfView": settings.fov,
            "width": settings.image_size,
            "height": settings.image_size,
            "platform": getattr(platform_mod, cfg.ai2thor_platform),
        }
        if executable is not None:
            kwargs["local_executable_path"] = executable
        try:
            self.controller = controller_mod.Controller(**kwargs)
        except Exception as exc:  # the Unity process failed to start: not this server's bug
            raise EnvError(f"AI2-THOR failed to start: {exc}", code="UNAVAILABLE") from exc
        self.task: NavTask | None = None
        self.event: Any = None
        self._reachable: set[tuple[float, float]] = set()
        self._origin = (0.0, 0.0)

    # ---- tasks ------------------------------------------------------------------------
    def sample_task(self, task_set: str, seed: int, max_actions: int) -> NavTask:
        if self.file_tasks:
            return self.file_tasks[seed % len(self.file_tasks)]
        rng = np.random.default_rng([seed, 7])
        for _ in range(20):
            scene = self.cfg.ai2thor_scenes[int(rng.integers(len(self.cfg.ai2thor_scenes)))]
            task = self._generate(scene, task_set, rng, max_actions)
            if task is not None:
                return task
        raise EnvError(
            f"no solvable {task_set} task for seed {seed} within {max_actions} actions and a "
            f"success distance of {self.settings.success_distance:g} m; allow more actions "
            "(max_actions_per_episode, max_turns) or change success_distance"
        )

    def _generate(
        self, scene: str, task_set: str, rng: np.random.Generator, max_actions: int
    ) -> NavTask | None:
        self.event = self.controller.reset(scene=scene)
        objects = [o for o in self.event.metadata["objects"] if o["objectType"] in THOR_TARGETS]
        if not objects:
            return None
        target = objects[int(rng.integers(len(objects)))]
        if sum(o["objectType"] == target["objectType"] for o in objects) > 1:
            return None  # the instruction names a type: it must be unique in the scene
        positions = (
            self.controller.step(action="GetReachablePositions").metadata["actionReturn"] or []
        )
        tx, tz = target["position"]["x"], target["position"]["z"]
        far = [
            p
            for p in positions
            if math.hypot(p["x"] - tx, p["z"] - tz) >= self.settings.success_distance + 1.0
        ]
        if not far:
            return None
        start = far[int(rng.integers(len(far)))]
        use, look = THOR_TARGETS[target["objectType"]]
        task = NavTask(
            task_set=task_set,
            instruction=write_instruction(
                task_set, rng, name=target["objectType"], use=use, look=look
            ),
            target_id=target["objectId"],
            target_type=target["objectType"],
            scene=scene,
            agent_position=(start["x"], start["y"], start["z"]),
            agent_rotation=0.0,
            agent_horizon=0.0,
        )
        self.reset(task)
        # face into the room, as the paper's tasks do: the first heading with an object in view
        for quarter in rng.permutation(4):
            task.agent_rotation = float(90 * int(quarter))
            self.event = self.controller.step(
                action="TeleportFull",
                position={"x": start["x"], "y": start["y"], "z": start["z"]},
                rotation={"x": 0, "y": task.agent_rotation, "z": 0},
                horizon=0.0,
                standing=True,
            )
            if any(o.visible for o in self.objects()):
                break
        else:
            return None
        plan = self.plan(task.target_id, max_actions)
        if plan is None or len(plan) < 2:
            return None
        task.optimal_actions = len(self.plan(task.target_id, max_actions, facing=False) or plan)
        return task

    # ---- Backend ------------------------------------------------------------------------
    def reset(self, task: NavTask) -> None:
        self.task = task
        self.event = self.controller.reset(scene=task.scene)
        for object_id in task.objects_to_hide:
            self.controller.step(action="DisableObject", objectId=object_id)
        positions = (
            self.controller.step(action="GetReachablePositions").metadata["actionReturn"] or []
        )
        self._reachable = {(round(p["x"], 2), round(p["z"], 2)) for p in positions}
        x, y, z = task.agent_position
        self._origin = (x, z)
        self.event = self.controller.step(
            action="TeleportFull",
            position={"x": x, "y": y, "z": z},
            rotation={"x": 0, "y": task.agent_rotation, "z": 0},
            horizon=task.agent_horizon,
            standing=True,
        )
        if not self.event.metadata["lastActionSuccess"]:
            raise EnvError(
                f"cannot place the agent at the task's start pose in {task.scene}: "
                f"{self.event.metadata.get('errorMessage')}",
                code="INVALID_ARGUMENT",
            )

    def apply(self, action: str) -> bool:
        self.event = self.controller.step(**ACTION_MAP[action])
        return bool(self.event.metadata["lastActionSuccess"])

    def render(self) -> np.ndarray:
        return np.ascontiguousarray(self.event.frame[:, :, :3], dtype=np.uint8)

    def pose(self) -> Pose:
        agent = self.event.metadata["agent"]
        return thor_pose(agent["position"], agent["rotation"]["y"], agent["cameraHorizon"])

    def objects(self) -> list[ObjectState]:
        return [
            ObjectState(
                o["objectId"],
                o["objectType"],
                o["position"]["x"],
                o["position"]["z"],
                bool(o["visible"]),
            )
            for o in self.event.metadata["objects"]
        ]

    def _xz(self, cell: planner.Cell) -> tuple[float, float]:
        return self._origin[0] + STEP_METRES * cell[0], self._origin[1] + STEP_METRES * cell[1]

    def passable(self, a: planner.Cell, b: planner.Cell) -> bool:
        (ax, az), (bx, bz) = self._xz(a), self._xz(b)
        points = [(bx, bz), ((ax + bx) / 2, (az + bz) / 2)]
        return all((round(x, 2), round(z, 2)) in self._reachable for x, z in points)

    def plan(self, target_id: str, max_len: int, facing: bool = True) -> list[str] | None:
        pose = self.pose()
        target = next(o for o in self.objects() if o.id == target_id)
        cell = (
            round((pose.x - self._origin[0]) / STEP_METRES),
            round((pose.z - self._origin[1]) / STEP_METRES),
        )
        forward = (round(pose.forward[0]), round(pose.forward[1]))
        right = (round(pose.right[0]), round(pose.right[1]))
        is_goal = planner.reach_goal(
            (target.x, target.z), self._xz, self.settings.success_distance, facing
        )
        return planner.shortest_plan((cell, forward, right), self.passable, is_goal, max_len)

    def agent_state(self) -> dict[str, Any]:
        agent = self.event.metadata["agent"]
        return {
            "position": dict(agent["position"]),
            "yaw": agent["rotation"]["y"],
            "horizon": agent["cameraHorizon"],
        }

    def set_agent_state(self, state: dict[str, Any]) -> None:
        self.event = self.controller.step(
            action="TeleportFull",
            position=state["position"],
            rotation={"x": 0, "y": state["yaw"], "z": 0},
            horizon=state["horizon"],
            standing=True,
        )

    def close(self) -> None:
        if self.controller is not None:
            self.controller.stop()
            self.controller = None
