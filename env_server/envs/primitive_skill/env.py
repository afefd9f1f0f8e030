"""PrimitiveSkill: a Panda arm on a table, driven by pick / place / push primitives.

ManiSkill3 (SAPIEN 3) with CPU physics; the image comes from a third-person camera
rendered through any Vulkan device (Mesa lavapipe on CPU-only machines).

Reward (VAGEN): the episode's environment reward is given on its last turn:
stage score at the end - stage score at the start - 0.1 per executed primitive, where
the stage score is 10 on success and otherwise 2 x (highest completed stage + 1).

The tasks are in `tasks.py`, the scripted expert in `oracle.py`, the grading of state
descriptions in `grading.py`, the camera image in `render.py`.
"""

from __future__ import annotations

import copy
import functools
import importlib.util
import json
import math
import subprocess
import sys
from typing import Any, ClassVar, Literal

import numpy as np
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
from env_server.core.env import Reward, no_episode
from env_server.core.spatial import GradingSpec

from . import grading

TASK_NAMES = ("AlignTwoCube", "PlaceTwoCube", "StackThreeCube", "PutAppleInDrawer")
ARITY = {"pick": 3, "place": 3, "push": 6}
PRIMITIVES_PER_TURN = 2
PRIMITIVE_COST = 0.1
SUCCESS_SCORE = 10.0


class PrimitiveSkillConfig(EnvConfig):
    task: Literal["AlignTwoCube", "PlaceTwoCube", "StackThreeCube", "PutAppleInDrawer"] = Field(
        "AlignTwoCube", description="Which of the paper's four tabletop tasks."
    )
    image_size: int = Field(300, ge=64, le=1024, description="Side of the square camera image.")
    max_primitives: int = Field(10, ge=1, le=50, description="Executed primitives per episode.")
    success_reward: Reward = Field(
        0.0, description="A bonus on the turn the task succeeds (VAGEN main's success_reward)."
    )


def stage_score(stages: list[bool]) -> float:
    """10 on success (the last stage), else 2 x (highest completed stage + 1)."""
    if stages[-1]:
        return SUCCESS_SCORE
    done = [i for i, ok in enumerate(stages[:-1]) if ok]
    return 2.0 * ((max(done) if done else -1) + 1)


@functools.cache
def _backend_problem() -> str | None:
    for module in ("mani_skill", "sapien"):
        if importlib.util.find_spec(module) is None:
            return f"{module} is not installed: pip install 'visenv[primitive_skill]'"
    # a Vulkan device is needed even without rendering; probe in a child process so
    # that a broken driver cannot take the server down
    probe = "import sapien; sapien.render.RenderSystem()"
    try:
        done = subprocess.run(
            [sys.executable, "-c", probe], capture_output=True, text=True, timeout=120
        )
    except subprocess.TimeoutExpired:
        return "probing SAPIEN's Vulkan renderer timed out"
    if done.returncode != 0:
        last = (done.stderr.strip().splitlines() or ["unknown error"])[-1]
        return (
            f"SAPIEN found no usable Vulkan device ({last}); install a GPU driver or "
            "Mesa >= 24.3 lavapipe (scripts/install_vulkan.sh)"
        )
    return None


def _mm(p: np.ndarray) -> list[int]:
    return [int(round(float(v) * 1000)) for v in p]


def _fmt(p: list[int]) -> str:
    return f"({p[0]}, {p[1]}, {p[2]})"


class PrimitiveSkillEnv(Environment):
    name = "primitive_skill"
    Config = PrimitiveSkillConfig
    description = (
        "Panda arm on a table (ManiSkill3): pick / place / push in millimetres; "
        "AlignTwoCube, PlaceTwoCube, StackThreeCube, PutAppleInDrawer"
    )
    fork_tolerance = (
        "contact caches are not part of the simulator state: after a fork a "
        "held or resting object may settle, so positions can differ from the "
        "source's by up to 5 mm (and images by a few pixels)"
    )
    grading: ClassVar[GradingSpec] = grading.GRADING
    seed_bits = 32  # ManiSkill seeds numpy's legacy generator: larger seeds are mapped onto it

    def __init__(self, config: PrimitiveSkillConfig | None = None) -> None:
        super().__init__(config)
        self.config: PrimitiveSkillConfig
        # the simulator modules load here, not at import: listing environments and
        # reading their action space needs no simulator
        from .controller import ArmController, Skills
        from .render import camera_info
        from .scene import TabletopScene
        from .tasks import TASKS

        self._camera_info = camera_info(self.config.image_size)

        self.task = TASKS[self.config.task]()
        self.scene = TabletopScene(self.task, image_size=self.config.image_size)
        self.scene.reset(seed=0)  # builds the scene once; reset(seed) re-places objects
        self._make_arm = lambda: ArmController(self.scene)
        self._make_skills = Skills
        self._seed: int | None = None
        self._closed = False

    # ---- availability ----------------------------------------------------------
    @classmethod
    def unavailable_reason(cls) -> str | None:
        return _backend_problem()

    @classmethod
    def action_space_for(cls, config: EnvConfig) -> ActionSpace:
        return ActionSpace(
            kind=ActionKind.CALL,
            names=("pick", "place", "push"),
            max_per_turn=PRIMITIVES_PER_TURN,
            arity=dict(ARITY),
            description=(
                "pick(x, y, z) grasps the object at that point; place(x, y, z) puts the held "
                "object there; push(x1, y1, z1, x2, y2, z2) moves the closed gripper in a "
                "straight line from the first point to the second. Integer millimetres."
            ),
        )

    # ---- episode -----------------------------------------------------------------
    def _reset(self, seed: int) -> Observation:
        if self._closed:
            raise EnvError("environment is closed", code="FAILED_PRECONDITION")
        rng = np.random.default_rng(seed)
        self.scene.layout = self.task.sample_layout(rng)
        # a rebuilt PhysX scene: one that kept the last episode's contact caches would play
        # the same seed a few millimetres differently (about 1 s; the first build is slower)
        self.scene.reset(seed=seed, options={"reconfigure": True})
        self.arm = self._make_arm()
        self.skills = self._make_skills(self.arm, self.task)
        self.arm.wait(5)  # let the objects settle on the table
        self._order = [str(n) for n in rng.permutation(list(self.task.positions()))]
        self._seed = seed
        self._used = 0
        self._start_score = stage_score(self._stages())
        return self._observation(header="[Initial observation]")

    def _apply(self, actions: list[Action]) -> Transition:
        from .controller import PrimitiveError

        invalid: list[str] = []
        results: list[str] = []
        executed = 0
        for action in actions:
            label = self._label(action)
            if self._used >= self.config.max_primitives:
                invalid.append(
                    f"{label}: the episode's {self.config.max_primitives} primitives are used up"
                )
                continue
            try:
                name, points, clipped = self._parse(action)
            except PrimitiveError as exc:
                invalid.append(f"{label}: {exc}")
                continue
            try:
                if name == "pick":
                    note = self.skills.pick(points[0])
                elif name == "place":
                    note = self.skills.place(points[0])
                else:
                    note = self.skills.push(points[0], points[1])
            except PrimitiveError as exc:
                invalid.append(f"{label}: {exc}")
                continue
            executed += 1
            self._used += 1
            results.append(f"{label}: {note}" + (" (clipped to the workspace)" if clipped else ""))
            if self._stages()[-1]:
                break
        stages = self._stages()
        success = stages[-1]
        terminated = success
        # the primitive budget is this environment's own; max_turns is the base class's
        truncated = not terminated and self._used >= self.config.max_primitives
        reward = 0.0
        if terminated or truncated or self.last_turn:  # the episode's reward, on its last turn
            reward = stage_score(stages) - self._start_score - PRIMITIVE_COST * self._used
        reward += self.config.success_reward if success else 0.0
        lines = results + [f"{msg} (not executed)" for msg in invalid + self.refused]
        obs = self._observation(header="[Observation after your actions]", results=lines)
        return Transition(
            observation=obs,
            reward=float(reward),
            terminated=terminated,
            truncated=truncated,
            success=success,
            actions_executed=executed,
            invalid_actions=invalid,
            info={
                "stage_score": stage_score(stages),
                "start_score": self._start_score,
                "primitives_used": self._used,
                "results": results,
            },
        )

    def _oracle(self) -> list[Action]:
        from .oracle import oracle_actions

        return oracle_actions(self.task, self.task.positions(), self.skills.grasped())

    # ---- actions -----------------------------------------------------------------
    @staticmethod
    def _label(action: Action) -> str:
        args = ", ".join(f"{a:g}" if isinstance(a, int | float) else repr(a) for a in action.args)
        return f"{action.name}({args})"

    def _parse(self, action: Action) -> tuple[str, list[np.ndarray], bool]:
        """Canonical name, world points (metres) clipped to the workspace, and whether
        clipping changed anything."""
        from .controller import PrimitiveError

        name = self.action_space.lookup(action.name)
        if name is None:
            raise PrimitiveError("unknown primitive; use pick, place or push")
        if len(action.args) != ARITY[name]:
            raise PrimitiveError(f"{name} takes {ARITY[name]} numbers, got {len(action.args)}")
        try:
            values = [float(a) for a in action.args]
        except (TypeError, ValueError):
            raise PrimitiveError("arguments must be numbers (millimetres)") from None
        if not all(math.isfinite(v) for v in values):
            raise PrimitiveError("arguments must be finite numbers")
        lows = [lo for lo, _ in self.task.workspace_mm]
        highs = [hi for _, hi in self.task.workspace_mm]
        points, clipped = [], False
        for k in range(0, len(values), 3):
            mm = np.round(values[k : k + 3])
            inside = np.clip(mm, lows, highs)
            clipped |= bool(np.any(inside != mm))
            points.append(inside / 1000.0)
        return name, points, clipped

    # ---- state -------------------------------------------------------------------
    def _stages(self) -> list[bool]:
        stages = self.task.stages(self.task.positions(), self.skills.grasped())
        return [bool(stage) for stage in stages]  # plain bools: numpy's are not JSON

    def ground_truth(self) -> dict[str, Any]:
        if self._seed is None:
            raise no_episode()
        stages = self._stages()
        return {
            "task": self.task.name,
            "objects": {n: _mm(p) for n, p in self.task.positions().items()},
            "gripper": _mm(self.arm.tcp),
            "holding": self.skills.grasped(),
            "stages": stages,
            "stage_score": stage_score(stages),
            "success": stages[-1],
            "workspace_mm": [list(map(int, r)) for r in self.task.workspace_mm],
            **self.task.extra(),
        }

    def describe(self, state: dict[str, Any], representation: Representation) -> str:
        representation = Representation(representation)
        flat = {"gripper": state["gripper"], **state["objects"]}
        if representation is Representation.STRUCTURED:
            return json.dumps(flat)
        if representation is Representation.NATURAL:
            held = state.get("holding")
            out = [
                f"The gripper is at {_fmt(state['gripper'])} mm, "
                + (f"holding the {held.replace('_', ' ')}." if held else "holding nothing.")
            ]
            out += [
                f"The {n.replace('_', ' ')} is at {_fmt(p)} mm."
                for n, p in state["objects"].items()
            ]
            return " ".join(out)
        return grading.grid(flat, state.get("workspace_mm") or self.task.workspace_mm)

    # ---- world-model grading and prompts -------------------------------------------
    def grade_description(
        self, text: str, truth: dict[str, Any], representation: Representation
    ) -> float:
        """Score in [0, 1] of a description against `truth` (the structured state, parsed);
        used by `reasoning/` instead of its grid readers (see `grading.py`)."""
        true_grid = grading.grid(grading.positions_only(truth), self.task.workspace_mm)
        return grading.grade(
            text,
            truth,
            Representation(representation).value,
            self.grading.tolerance,
            true_grid,
            grading.LETTERS,
        )

    def state_prompt(self, representation: Representation) -> StatePrompt:
        """How to write a state (mm positions, the 50 mm grid), with a made-up example."""
        return grading.state_prompt(
            self, representation, list(self.task.positions()), self.task.workspace_mm
        )

    # ---- text ----------------------------------------------------------------------
    def _observation(self, header: str, results: list[str] | None = None) -> Observation:
        gt = self.ground_truth()
        positions = [gt["objects"][n] for n in self._order]
        (x0, x1), (y0, y1), (z0, z1) = gt["workspace_mm"]
        parts = [header]
        if results:
            parts.append("Action results: " + "; ".join(results))
        parts += [
            IMAGE_PLACEHOLDER,
            f"Human instruction: {self.task.instruction}",
            f"x_workspace_limit: [{x0}, {x1}]",
            f"y_workspace_limit: [{y0}, {y1}]",
            f"z_workspace_limit: [{z0}, {z1}]",
            f"Object positions (mm, in no particular order): {positions}",
            f"Gripper position (mm): {gt['gripper']}",
        ]
        extra = {k: gt[k] for k in self.task.extra()}
        if extra:
            parts.append(f"Other information: {extra}")
        parts.append(f"Primitives left this episode: {self.config.max_primitives - self._used}")
        return Observation(
            text="\n".join(parts),
            images=[self.scene.render_rgb()],
            ground_truth=gt,
            info={"task": self.task.name, "turn": self.turn, "camera": self._camera_info},
        )

    def system_prompt(self, format: ResponseFormat) -> str:
        return (
            "You control a Franka Panda robot arm above a table, seen by a camera across the "
            "table from the robot. Coordinates are integer millimetres in the table frame: x "
            "points from the robot towards the camera, y to the right in the image, z up from "
            "the table top. You are given the workspace limits and the positions of the objects "
            "as an unlabelled list: tell which is which from the image.\n"
            "Primitives:\n"
            "- pick(x, y, z): open the gripper, grasp the object at (x, y, z), lift it.\n"
            "- place(x, y, z): put the held object so that its centre is at (x, y, z), release.\n"
            "- push(x1, y1, z1, x2, y2, z2): close the gripper and move it in a straight line "
            "from (x1, y1, z1) to (x2, y2, z2), e.g. to slide a drawer shut.\n"
            "Points outside the workspace are clipped to it. A primitive that cannot be done "
            "(picking where there is no object, placing with nothing held) is skipped. "
            f"At most {self.action_space.max_per_turn} primitives per turn and "
            f"{self.config.max_primitives} per episode; each executed primitive costs "
            f"{PRIMITIVE_COST}. Completing the task scores {SUCCESS_SCORE:g}.\n"
            "Example: pick(62, -55, 20), place(80, 100, 20)"
        )

    def close(self) -> None:
        if not self._closed:
            self._closed = True
            self.scene.close()

    def _snapshot(self) -> Any:
        """The simulator state (poses, velocities, joint positions) plus the episode's
        counters; restore() puts a scene of the same task back into it. Contact caches
        are not part of the state, so a held object may settle by a few millimetres."""
        if self._seed is None:
            raise no_episode()
        sim = _clone(self.scene.get_state_dict())
        episode = {k: copy.deepcopy(getattr(self, k)) for k in _EPISODE_FIELDS}
        arm = (self.arm.gripper, self.arm.yaw, self.arm.steps)
        return {
            "task": self.task.name,
            "sim": sim,
            "episode": episode,
            "arm": arm,
            "held": self.skills.held,
        }

    def _restore(self, snapshot: Any) -> None:
        if snapshot.get("task") != self.task.name:
            raise EnvError(
                f"snapshot of {snapshot.get('task')!r} cannot be restored into a "
                f"{self.task.name!r} scene",
                code="INVALID_ARGUMENT",
            )
        if self._seed is None:  # the arm and skills are made at the first reset
            self.reset(snapshot["episode"]["_seed"])
        self.scene.set_state_dict(_clone(snapshot["sim"]))
        for k, v in snapshot["episode"].items():
            setattr(self, k, copy.deepcopy(v))
        self.arm.gripper, self.arm.yaw, self.arm.steps = snapshot["arm"]
        self.skills.held = snapshot["held"]
        # contacts (and so grasp detection) come from the last physics step: take one
        # control step holding the pose so that they describe the restored scene
        self.arm.wait(1)


# the episode's fields beside the simulator state (the turn count is the base class's)
_EPISODE_FIELDS = ("_seed", "_used", "_start_score", "_order")


def _clone(state: Any) -> Any:
    if isinstance(state, dict):
        return {k: _clone(v) for k, v in state.items()}
    return state.clone() if hasattr(state, "clone") else copy.deepcopy(state)
