"""The Navigation environment: reach a described object in first-person 3D rooms.

Same actions, ground truth, rewards and prompts whatever the backend (MiniWorld by
default, AI2-THOR where its Unity build is available). The expert is in `oracle.py`, the
grading of state descriptions in `grading.py`, the first-person image in `render.py`
(MiniWorld) and `ai2thor_backend.py`.

    env = NavigationEnv(NavigationEnv.Config(task_set="long_horizon"))
    obs = env.reset(seed=3)                  # obs.text holds the instruction and one <image>
    tr = env.step([Action("moveahead"), Action("rotateleft")])
    env.oracle_actions()                     # a shortest path's next actions
"""

from __future__ import annotations

import importlib.util
from ctypes.util import find_library
from typing import Any, ClassVar, Literal

from pydantic import Field

from env_server.core import (
    IMAGE_PLACEHOLDER,
    Action,
    ActionKind,
    ActionSpace,
    EnvConfig,
    EnvError,
    Environment,
    Observation,
    Representation,
    ResponseFormat,
    StatePrompt,
    Transition,
)
from env_server.core.env import Reward, no_episode, unknown_action
from env_server.core.spatial import GradingSpec

from . import geometry, grading, oracle
from .ai2thor_backend import AI2ThorBackend
from .backend import ACTIONS, Backend, BackendSettings
from .tasks import TASK_SETS, NavTask

SUCCESS_REWARD = 10.0
# VAGEN main's spellings of our actions (vagen/envs/navigation/navigation_env.py)
VAGEN_MAIN_NAMES = {
    "move_forward": "moveahead", "move_backward": "moveback", "move_left": "moveleft",
    "move_right": "moveright", "turn_left": "rotateleft", "turn_right": "rotateright",
    "look_up": "lookup", "look_down": "lookdown",
}  # fmt: skip
DEFAULT_FOV = 100.0  # degrees, as in the paper's AI2-THOR setup

TaskSet = Literal[
    "base", "common_sense", "complex_instruction", "visual_appearance", "long_horizon"
]
assert set(TaskSet.__args__) == set(TASK_SETS)  # type: ignore[attr-defined]


class NavigationConfig(EnvConfig):
    backend: Literal["miniworld", "ai2thor"] = Field(
        "miniworld",
        description="Simulator: MiniWorld (CPU, headless EGL) or AI2-THOR (needs its Unity build).",
    )
    task_set: TaskSet = Field(
        "base", description="Which of the five task sets; tasks are chosen by seed."
    )
    max_actions_per_turn: int = Field(5, ge=1, le=20, description="Actions one response may hold.")
    max_actions_per_episode: int = Field(
        30, ge=1, le=500, description="Actions before the episode is truncated."
    )
    success_reward: Reward = Field(SUCCESS_REWARD, description="Reward for reaching the target.")
    success_distance: float = Field(
        1.5, gt=0, le=10, description="Success radius around the target, metres, floor plane."
    )
    image_size: int = Field(
        255, ge=32, le=1024, description="Side of the square first-person image, pixels."
    )
    fov: float = Field(
        DEFAULT_FOV, gt=10, lt=170, description="Field of view of the square image, degrees."
    )
    max_visible_objects: int = Field(
        5, ge=0, le=20, description="Nearest visible objects listed in the ground truth."
    )
    # AI2-THOR only. Which executable runs, whether ai2thor may download its build, and the
    # folder task files are read from are the server operator's choice (environment
    # variables, see ai2thor_backend.py), never a remote client's.
    ai2thor_platform: Literal["CloudRendering", "Linux64"] = Field(
        "CloudRendering",
        description="AI2-THOR platform: CloudRendering (Vulkan, headless) or Linux64 (X display).",
    )
    ai2thor_task_file: str | None = Field(
        None,
        max_length=200,
        description="Name of a task file (the paper's {'tasks': [...]} shape) in the server's "
        "$VISENV_AI2THOR_TASK_DIR; without it (and ai2thor_tasks) tasks come from scene metadata.",
    )
    ai2thor_tasks: dict[str, Any] | None = Field(
        None, description="Tasks given inline, in the same {'tasks': [...]} shape as a task file."
    )
    ai2thor_scenes: list[str] = Field(
        default_factory=lambda: [
            f"FloorPlan{i}"
            for i in (*range(1, 31), *range(201, 231), *range(301, 331), *range(401, 431))
        ],
        max_length=500,
        description="iTHOR scenes to generate tasks in when no tasks are given.",
    )


class NavigationEnv(Environment):
    name = "navigation"
    Config = NavigationConfig
    description = (
        "First-person navigation in furnished multi-room interiors: reach the object the "
        "instruction describes (five task sets; MiniWorld, or AI2-THOR where available)."
    )
    grading: ClassVar[GradingSpec] = grading.GRADING
    # MiniWorld renders through an EGL context, which is current in one thread at a time:
    # a world pre-warmed in another thread rendered another world's picture in this one
    thread_bound = True

    config: NavigationConfig

    def __init__(self, config: NavigationConfig | None = None) -> None:
        super().__init__(config)
        cfg = self.config
        settings = BackendSettings(
            image_size=cfg.image_size,
            fov=cfg.fov,
            success_distance=cfg.success_distance,
        )
        self.backend: Backend = _make_backend(cfg, settings)
        self.task: NavTask | None = None
        self.actions_taken = 0
        self._gt: dict[str, Any] | None = None

    # ---- availability -------------------------------------------------------------------
    @classmethod
    def unavailable_reason(cls) -> str | None:
        """The default (MiniWorld) backend's needs; AI2-THOR is checked per session."""
        if importlib.util.find_spec("miniworld") is None:
            return "the miniworld package is not installed: pip install 'visenv[navigation]'"
        if find_library("EGL") is None or find_library("GLU") is None:
            return (
                "no EGL/GLU libraries for headless rendering: "
                "apt-get install libegl1 libgl1-mesa-dri libglu1-mesa"
            )
        return None

    @classmethod
    def action_space_for(cls, config: EnvConfig) -> ActionSpace:
        cfg = NavigationConfig.model_validate(config)  # the instance itself, not a copy
        return ActionSpace(
            kind=ActionKind.DISCRETE,
            names=ACTIONS,
            max_per_turn=cfg.max_actions_per_turn,
            description=(
                "moveahead/moveback/moveleft/moveright move 0.5 m without turning; "
                "rotateleft/rotateright turn 90 degrees; lookup/lookdown tilt the camera 30 degrees."
            ),
            vagen_names=VAGEN_MAIN_NAMES,
        )

    # ---- episode ------------------------------------------------------------------------
    def _reset(self, seed: int) -> Observation:
        cfg = self.config
        budget = min(cfg.max_actions_per_episode, cfg.max_turns * cfg.max_actions_per_turn)
        self.task, self._gt = None, None  # a failed reset leaves no episode
        self.task = self.backend.sample_task(cfg.task_set, seed, budget)
        self.backend.reset(self.task)
        self.actions_taken = 0
        self._gt = None
        return self._observation(feedback="")

    def _apply(self, actions: list[Action]) -> Transition:
        cfg = self.config
        executed: list[str] = []
        blocked: list[str] = []
        invalid: list[str] = []
        success = False  # an episode that had succeeded would have ended
        for action in actions:
            name = self.action_space.lookup(action.name)
            if name is None:
                invalid.append(unknown_action(action, self.action_space))
                break  # the rest of the turn was planned on top of it
            if success or self.actions_taken >= cfg.max_actions_per_episode:
                break
            moved = self.backend.apply(name)
            self._gt = None
            executed.append(name)
            self.actions_taken += 1
            if not moved:
                blocked.append(name)
            success = self._success()
        terminated = success
        # the episode's action budget is this environment's own; max_turns is the base's
        truncated = not terminated and self.actions_taken >= cfg.max_actions_per_episode
        feedback = _feedback(executed, blocked, invalid + self.refused)
        obs = self._observation(feedback)
        return Transition(
            observation=obs,
            reward=self.config.success_reward if success else 0.0,
            terminated=terminated,
            truncated=truncated,
            success=success,
            actions_executed=len(executed),
            invalid_actions=invalid,
            info={
                "blocked_actions": blocked,
                "distance": obs.ground_truth["target"]["distance"],
                "actions_left": cfg.max_actions_per_episode - self.actions_taken,
            },
        )

    def _oracle(self) -> list[Action]:
        assert self.task is not None
        left = self.config.max_actions_per_episode - self.actions_taken
        return oracle.oracle_actions(self.backend, self.task.target_id, left)

    def _success(self) -> bool:
        return bool(self.ground_truth()["success"])

    def _observation(self, feedback: str) -> Observation:
        assert self.task is not None
        left = self.config.max_actions_per_episode - self.actions_taken
        text = (
            (f"{feedback}\n" if feedback else "")
            + f"[Observation]: {IMAGE_PLACEHOLDER}\n"
            + f"Human instruction: {self.task.instruction}\n"
            + f"You may take up to {min(self.config.max_actions_per_turn, left)} actions now "
            + f"({left} left in this episode)."
        )
        gt = self.ground_truth()
        return Observation(
            text=text,
            images=[self.backend.render()],
            ground_truth=gt,
            info={
                "task_set": self.task.task_set,
                "instruction": self.task.instruction,
                "backend": self.config.backend,
                "optimal_actions": self.task.optimal_actions,
            },
        )

    # ---- ground truth and text ------------------------------------------------------------
    def ground_truth(self) -> dict[str, Any]:
        if self.task is None:
            raise no_episode()
        if self._gt is None:
            objects = self.backend.objects()
            target = next((o for o in objects if o.id == self.task.target_id), None)
            if target is None:
                raise EnvError(
                    f"target {self.task.target_id!r} is not in the scene", code="INTERNAL"
                )
            self._gt = geometry.build_ground_truth(
                self.backend.pose(),
                target,
                objects,
                instruction=self.task.instruction,
                success_distance=self.config.success_distance,
                max_objects=self.config.max_visible_objects,
            )
        return self._gt

    def describe(self, state: dict[str, Any], representation: Representation) -> str:
        representation = Representation(representation)
        if representation is Representation.STRUCTURED:
            return geometry.describe_structured(state)
        if representation is Representation.SYMBOLIC:
            return geometry.describe_symbolic(state)
        return geometry.describe_natural(state)

    def grade_description(
        self, text: str, truth: dict[str, Any], representation: Representation
    ) -> float:
        """Score in [0, 1] of a description against `truth` (the structured state, parsed);
        used by `reasoning/` instead of its grid readers (see `grading.py`)."""
        return grading.grade(
            text, truth, Representation(representation).value, self.grading.tolerance
        )

    def state_prompt(self, representation: Representation) -> StatePrompt:
        """How to write a state in this env's egocentric metres, with a made-up example
        (before and after one 'moveahead') written by `describe` (see `grading.py`)."""
        return grading.state_prompt(self, representation)

    def system_prompt(self, format: ResponseFormat) -> str:
        cfg = self.config
        fmt = ResponseFormat(format)
        vagen = fmt.value.startswith("vagen_")  # VAGEN main's formats: its action names
        n = {c: v for v, c in VAGEN_MAIN_NAMES.items()} if vagen else {a: a for a in ACTIONS}
        separated = (
            "separated as the response format below says"
            if vagen
            else f"separated by commas, e.g. '{n['moveahead']}, {n['moveahead']}, "
            f"{n['rotateleft']}'"
        )
        text = (
            "You are a home robot that navigates first-person through indoor rooms to reach the "
            "object a human asks for.\n"
            "Actions:\n"
            f"- {n['moveahead']}, {n['moveback']}: move 0.5 m forward or backward\n"
            f"- {n['moveleft']}, {n['moveright']}: step 0.5 m sideways without turning\n"
            f"- {n['rotateleft']}, {n['rotateright']}: turn 90 degrees in place\n"
            f"- {n['lookup']}, {n['lookdown']}: tilt the camera 30 degrees up or down\n"
            f"You may give up to {cfg.max_actions_per_turn} actions per turn, {separated}. "
            "Walls and furniture block movement.\n"
            f"You succeed when you are within {cfg.success_distance:g} m of the target object "
            f"(reward {cfg.success_reward:g}). The episode ends after "
            f"{cfg.max_actions_per_episode} actions or {cfg.max_turns} turns."
        )
        if fmt in (
            ResponseFormat.GROUNDING,
            ResponseFormat.GROUNDING_WORLDMODELING,
            ResponseFormat.WORLDMODELING,
            ResponseFormat.VAGEN_WM,
            ResponseFormat.VAGEN_FREE_WM,
        ):
            text += (
                "\nWhen you describe where things are, give each object's distance and direction "
                "relative to you, e.g. 'The chair is 2.30 m ahead, slightly to the left.'"
            )
        return text

    # ---- lifecycle ------------------------------------------------------------------------
    def close(self) -> None:
        self.backend.close()

    def _snapshot(self) -> Any:
        return {
            "task": self.task,
            "agent": self.backend.agent_state(),
            "actions_taken": self.actions_taken,
        }

    def _restore(self, snapshot: Any) -> None:
        self.task = snapshot["task"]
        if self.task is not None:
            self.backend.reset(self.task)
            self.backend.set_agent_state(snapshot["agent"])
        self.actions_taken = snapshot["actions_taken"]
        self._gt = None


def _feedback(executed: list[str], blocked: list[str], invalid: list[str]) -> str:
    parts = []
    if executed:
        parts.append(f"Executed: {', '.join(executed)}.")
    if blocked:
        parts.append(f"Blocked (nothing moved): {', '.join(blocked)}.")
    if invalid:
        parts.append(f"Invalid: {'; '.join(invalid)}.")
    return " ".join(parts)


def _make_backend(cfg: NavigationConfig, settings: BackendSettings) -> Backend:
    if cfg.backend == "ai2thor":
        return AI2ThorBackend(settings, cfg)
    reason = NavigationEnv.unavailable_reason()
    if reason is not None:
        raise EnvError(f"navigation (miniworld) is unavailable here: {reason}", code="UNAVAILABLE")
    # loaded only here: it needs miniworld and EGL, which the AI2-THOR backend does not
    from .miniworld_backend import MiniWorldBackend

    return MiniWorldBackend(settings)
