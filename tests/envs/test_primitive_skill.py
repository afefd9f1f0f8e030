"""primitive_skill on the real ManiSkill3 simulator (CPU physics, Vulkan rendering).

One simulator per task is shared by the whole module (the first one costs ~1 GB and a
shader warm-up; the next ones a few MB). The oracle on 2 seeds per task, determinism,
preconditions, bad configs, snapshots and plain types are checked by the contract suite
(tests/envs/test_contract.py); the 20-seed success rates come from
`bench/bench_primitive_skill.py --seeds 20`.
"""

from __future__ import annotations

import json

import numpy as np
import pytest

from env_server.core import Action, EnvError, Representation, ResponseFormat
from env_server.envs.primitive_skill import PrimitiveSkillConfig, PrimitiveSkillEnv, stage_score
from env_server.envs.primitive_skill.env import _backend_problem

pytestmark = [
    pytest.mark.skipif(
        PrimitiveSkillEnv.unavailable_reason() is not None,
        reason=f"primitive_skill unavailable: {PrimitiveSkillEnv.unavailable_reason()}",
    ),
    # ManiSkill calls np.isnan on torch tensors (NumPy 2 deprecation), once per control step
    pytest.mark.filterwarnings("ignore::DeprecationWarning"),
]


@pytest.fixture(scope="module")
def envs():
    made: dict[str, PrimitiveSkillEnv] = {}

    def get(task: str) -> PrimitiveSkillEnv:
        if task not in made:
            made[task] = PrimitiveSkillEnv(PrimitiveSkillConfig(task=task))
        return made[task]

    yield get
    for env in made.values():
        env.close()


# ---- no simulator needed -------------------------------------------------------------------


def test_stage_score_follows_the_paper():
    assert stage_score([False, False, False]) == 0
    assert stage_score([True, False, False]) == 2
    assert stage_score([True, True, False, False]) == 4
    assert stage_score([False, False, True, False]) == 6  # highest completed stage counts
    assert stage_score([False, False, True]) == 10


def test_missing_vulkan_device_is_reported(monkeypatch):
    monkeypatch.setenv("VK_ICD_FILENAMES", "/nonexistent/icd.json")
    monkeypatch.setenv("VK_DRIVER_FILES", "/nonexistent/icd.json")
    reason = _backend_problem.__wrapped__()
    assert reason is not None and "Vulkan" in reason


# ---- the simulator -------------------------------------------------------------------------


def test_observation_and_representations(envs):
    env = envs("PlaceTwoCube")
    obs = env.reset(3)
    assert len(obs.images) == 1 and obs.images[0].shape == (300, 300, 3)
    assert obs.images[0].dtype == np.uint8 and obs.images[0].std() > 10  # a real picture
    gt = obs.ground_truth
    assert set(gt["objects"]) == {"red_cube", "green_cube", "left_target", "right_target"}
    assert gt["objects"]["left_target"][:2] == [80, -100]
    assert gt["workspace_mm"] == [[-100, 150], [-200, 200], [10, 200]]
    # the positions are listed without names
    line = next(li for li in obs.text.splitlines() if li.startswith("Object positions"))
    assert "cube" not in line and "target" not in line
    listed = json.loads(line.split(":", 1)[1])
    assert sorted(map(tuple, listed)) == sorted(map(tuple, gt["objects"].values()))
    assert "x_workspace_limit: [-100, 150]" in obs.text

    structured = json.loads(env.describe(gt, Representation.STRUCTURED))
    assert structured == {"gripper": gt["gripper"], **gt["objects"]}
    assert all(len(p) == 3 and all(isinstance(v, int) for v in p) for p in structured.values())
    natural = env.describe(gt, Representation.NATURAL)
    x, y, z = gt["objects"]["red_cube"]
    assert f"The red cube is at ({x}, {y}, {z}) mm." in natural
    assert "holding nothing" in natural
    grid = env.describe(gt, Representation.SYMBOLIC).splitlines()
    assert len(grid) == 5 and all(len(row) == 8 for row in grid)
    assert {"R", "G", "L", "T", "E"} <= set("".join(grid))
    assert env.grading.anchor == "gripper" and env.grading.tolerance == 30.0
    assert "pick(x, y, z)" in env.system_prompt(ResponseFormat.FREE_THINK)


def test_the_camera_frames_the_table(envs):
    """No black sky over the top of the picture, and the cubes large enough to see
    (the camera across the table looked over it: a black top 22%, cubes ~14 px)."""
    image = envs("AlignTwoCube").reset(2).images[0].astype(int)
    assert (image[:66].max(axis=2) < 20).mean() < 0.02  # the top 22%: not black
    red = (image[..., 0] > 120) & (image[..., 1] < 60) & (image[..., 2] < 60)
    green = (image[..., 1] > 120) & (image[..., 0] < 80) & (image[..., 2] < 80)
    assert red.sum() > 350 and green.sum() > 350, (red.sum(), green.sum())  # ~20 px cubes


def test_invalid_primitives_are_reported_not_raised(envs):
    env = envs("AlignTwoCube")
    obs = env.reset(2)
    before = obs.ground_truth["objects"]
    tr = env.step([Action("place", (0, 0, 20)), Action("pick", (-90, 0, 20))])
    assert tr.actions_executed == 0 and len(tr.invalid_actions) == 2
    assert "nothing is held" in tr.invalid_actions[0]
    assert "no object to pick" in tr.invalid_actions[1]
    assert "(not executed)" in tr.observation.text
    assert tr.reward == 0 and not tr.done and tr.info["primitives_used"] == 0
    tr = env.step([Action("pick", (1, 2)), Action("jump", (1, 2, 3)), Action("push", (0,) * 6)])
    assert tr.actions_executed == 0
    assert "pick takes 3 numbers" in tr.invalid_actions[0]
    assert "unknown primitive" in tr.invalid_actions[1]
    assert "over the limit of 2 actions per turn" in tr.invalid_actions[2]
    tr = env.step([Action("pick", (float("nan"), 0, 0))])
    assert "finite" in tr.invalid_actions[0]
    after = env.ground_truth()["objects"]
    for name in before:  # nothing moved
        assert np.allclose(before[name], after[name], atol=2)


def test_out_of_workspace_points_are_clipped(envs):
    env = envs("AlignTwoCube")
    gt = env.reset(4).ground_truth
    x, y, _ = gt["objects"]["green_cube"]
    # z far below the table is clipped to 10 mm: still a grasp of the green cube
    tr = env.step([Action("pick", (x, y, -500)), Action("place", (x, 900, 20))])
    assert tr.actions_executed == 2 and tr.invalid_actions == []
    assert "clipped" in tr.info["results"][0] and "clipped" in tr.info["results"][1]
    green = env.ground_truth()["objects"]["green_cube"]
    assert 185 <= green[1] <= 205  # put down at the workspace's edge, y = 200
    tr = env.step([Action("pick", (*green[:2], 20)), Action("pick", (0, 0, 20))])
    assert tr.actions_executed == 1 and "already holding the green_cube" in tr.invalid_actions[0]


def test_budget_truncates_and_charges_primitives(envs):
    env = envs("AlignTwoCube")
    env.config = PrimitiveSkillConfig(task="AlignTwoCube", max_turns=2, max_primitives=3)
    try:
        env.reset(7)
        tr = env.step([Action("push", (-50, -150, 30, -50, -100, 30))])
        assert tr.actions_executed == 1 and not tr.done and tr.reward == 0
        tr = env.step([Action("push", (-50, -150, 30, -50, -100, 30))] * 2)
        assert tr.truncated and not tr.terminated and not tr.success
        assert tr.reward == pytest.approx(-0.3)  # no stage gained, 3 primitives
        with pytest.raises(EnvError) as err:
            env.step([Action("pick", (0, 0, 20))])
        assert err.value.code == "FAILED_PRECONDITION"
    finally:
        env.config = PrimitiveSkillConfig(task="AlignTwoCube")


def test_snapshot_and_restore_fork_an_episode(envs):
    env = envs("StackThreeCube")
    env.reset(9)
    env.step(env.oracle_actions()[:1])  # holding the red cube
    snap = env.snapshot()
    held = env.ground_truth()
    assert held["holding"] == "red_cube"
    first = env.step(env.oracle_actions())
    env.restore(snap)
    again = env.ground_truth()
    for name, p in held["objects"].items():  # contact caches are not part of the state:
        assert np.allclose(again["objects"][name], p, atol=3)  # a held cube may settle
    assert again["holding"] == "red_cube"
    second = env.step(env.oracle_actions())
    assert second.info["primitives_used"] == first.info["primitives_used"]
    for name, p in first.observation.ground_truth["objects"].items():
        assert np.allclose(second.observation.ground_truth["objects"][name], p, atol=5)
    with pytest.raises(EnvError) as err:
        envs("AlignTwoCube").restore(snap)
    assert err.value.code == "INVALID_ARGUMENT"


@pytest.mark.parametrize("task", ["StackThreeCube", "PutAppleInDrawer"])
def test_random_primitives_never_break_the_episode(envs, task):
    """An agent's clumsy primitives (off-target picks, pushes through objects, places in
    mid-air) are executed or refused, and the state stays well-formed."""
    env = envs(task)
    rng = np.random.default_rng(123)
    gt = env.reset(3).ground_truth
    for _ in range(3):
        actions = []
        for _ in range(2):
            kind = rng.choice(["pick", "place", "push"])
            target = list(gt["objects"].values())[rng.integers(len(gt["objects"]))]
            noisy = [int(v + rng.integers(-40, 40)) for v in target]
            if kind == "push":
                actions.append(
                    Action("push", (*noisy, *[int(v) for v in rng.integers(-150, 150, 3)]))
                )
            else:
                actions.append(Action(str(kind), tuple(noisy)))
        tr = env.step(actions)
        assert tr.actions_executed + len(tr.invalid_actions) == 2
        assert all(isinstance(m, str) and m for m in tr.invalid_actions)
        gt = tr.observation.ground_truth
        json.dumps(gt)
        assert all(np.isfinite(p).all() for p in gt["objects"].values())
        if tr.done:
            break
