"""Navigation environment: MiniWorld backend (real headless rendering), oracle, ground truth,
the AI2-THOR backend's unavailable path, and one end-to-end run over a real server.

The full oracle check (50 seeds x 5 task sets) is `bench/bench_navigation.py --oracle 50`;
here a smaller real sample runs (OracleSample.SEEDS seeds per set).
"""

from __future__ import annotations

import json
import math
import socket

import numpy as np
import pydantic
import pytest

from env_server.core import Action, EnvError, Representation, ResponseFormat, registry
from env_server.envs.navigation import NavigationConfig, NavigationEnv, geometry
from env_server.envs.navigation import ai2thor_backend as thor
from env_server.envs.navigation.backend import BackendSettings
from env_server.envs.navigation.miniworld_backend import MiniWorldBackend
from env_server.envs.navigation.miniworld_layout import Layout, ObjectSpec, RoomSpec
from env_server.envs.navigation.render import entity_size as _size
from env_server.envs.navigation.tasks import TASK_SETS, NavTask, load_task_file

SMALL = 64  # image side for tests that do not look at pixels closely

pytestmark = pytest.mark.skipif(
    NavigationEnv.unavailable_reason() is not None, reason=str(NavigationEnv.unavailable_reason())
)


def make(**cfg) -> NavigationEnv:
    cfg.setdefault("image_size", SMALL)
    return NavigationEnv(NavigationConfig(**cfg))


def run_oracle(env: NavigationEnv, seed: int):
    env.reset(seed)
    while True:
        tr = env.step(env.oracle_actions())
        if tr.done:
            return tr


# ---- scenes (determinism, snapshots, plain types: tests/envs/test_contract.py) -----------


def test_sessions_in_one_process_keep_their_own_scenes():
    a, b = make(), make()
    try:
        first = a.reset(1).images[0]
        other = b.reset(2).images[0]  # builds another scene in the same GL share group
        assert not np.array_equal(first, other)
        assert np.array_equal(a.backend.render(), first)
        b.close()
        c = make()  # reuses b's pooled world
        assert np.array_equal(c.reset(2).images[0], other)
        assert np.array_equal(a.backend.render(), first)
        c.close()
    finally:
        a.close()
        b.close()


@pytest.mark.parametrize("task_set", TASK_SETS)
def test_every_start_sees_an_object(task_set):
    """Starts face into the room: the target or another object is in the first view."""
    env = make(task_set=task_set)
    try:
        for seed in range(8):
            gt = env.reset(seed).ground_truth
            assert gt["target"]["visible"] or gt["objects"], f"{task_set} seed {seed}: {gt}"
    finally:
        env.close()


# ---- oracle -------------------------------------------------------------------------------


class OracleSample:
    SEEDS = 15


@pytest.mark.parametrize("task_set", TASK_SETS)
def test_oracle_reaches_the_target(task_set):
    env = make(task_set=task_set)
    try:
        wins = 0
        for seed in range(OracleSample.SEEDS):
            tr = run_oracle(env, seed)
            wins += tr.success
            # the oracle also turns to face the target: never shorter than a shortest solution
            assert env.task.optimal_actions <= env.actions_taken
            if tr.success:
                assert tr.terminated and not tr.truncated and tr.reward == 10.0
                assert tr.observation.ground_truth["target"]["distance"] <= 1.5
            assert env.actions_taken <= 30
        assert wins == OracleSample.SEEDS  # generation keeps only tasks the oracle solves
    finally:
        env.close()


def test_instruction_in_text_and_task_sets_differ():
    texts = {}
    for task_set in TASK_SETS:
        env = make(task_set=task_set)
        try:
            obs = env.reset(5)
            assert env.task is not None and env.task.instruction in obs.text
            assert obs.text.count("<image>") == 1 and obs.images[0].shape == (SMALL, SMALL, 3)
            texts[task_set] = env.task
        finally:
            env.close()
    assert (
        "another room" in texts["long_horizon"].instruction
        or "not in this room" in texts["long_horizon"].instruction
    )
    assert texts["base"].target_type in texts["base"].instruction
    # the common-sense instruction describes the target by its use, never by name
    assert texts["common_sense"].target_type not in texts["common_sense"].instruction
    layout = texts["long_horizon"].scene
    target = next(o for o in layout.objects if o.id == texts["long_horizon"].target_id)
    x, _, z = texts["long_horizon"].agent_position
    assert not layout.rooms[target.room].contains(x, z)  # starts in another room


# ---- ground truth against geometry ----------------------------------------------------------


def one_room_backend(size: int = 96):
    backend = MiniWorldBackend(BackendSettings(image_size=size, fov=90.0, success_distance=1.5))
    radius, height = _size("box", "red")
    box = ObjectSpec(
        "red_box_0", "box", "red", x=3.25, z=4.75, dir=0.0, radius=radius, height=height, room=0
    )
    room = RoomSpec(0, 6, 0, 8, "concrete", "floor_tiles_bw", "white")
    layout = Layout([room], [], [box])
    # agent at (3.25, 1.25) facing +z (MiniWorld dir 270 degrees = 3 quarter turns): the box is 3.5 m ahead
    task = NavTask(
        "base", "go to the red box", "red_box_0", "red box", layout, (3.25, 0.0, 1.25), 270.0
    )
    backend.reset(task)
    return backend, task


def red_columns(image: np.ndarray) -> np.ndarray:
    r, g, b = (image[..., i].astype(int) for i in range(3))
    return np.nonzero(((r > 120) & (g < 60) & (b < 60)).any(axis=0))[0]


def test_ground_truth_agrees_with_geometry_and_pixels():
    backend, task = one_room_backend()
    try:
        pose = backend.pose()
        assert pose.forward == (0.0, 1.0)
        target = next(o for o in backend.objects() if o.id == "red_box_0")
        gt = geometry.build_ground_truth(
            pose, target, backend.objects(), instruction="", success_distance=1.5, max_objects=5
        )
        assert gt["target"]["direction"] == "ahead"
        assert gt["target"]["distance"] == 3.5
        assert gt["target"]["position"] == [0.0, 3.5]
        assert gt["target"]["visible"] is True
        cols = red_columns(backend.render())
        assert cols.size and abs(cols.mean() - 48) < 8  # centred in a 96-px image

        assert backend.apply("moveahead")
        target = next(o for o in backend.objects() if o.id == "red_box_0")
        assert math.isclose(geometry.floor_distance(backend.pose(), target), 3.0)

        assert backend.apply("moveleft")  # the box is now to the right of straight ahead
        right, forward = geometry.relative(backend.pose(), target.x, target.z)
        assert right == pytest.approx(0.5) and forward == pytest.approx(3.0)
        assert geometry.direction_phrase(right, forward) == "ahead"  # 9.5 degrees: still "ahead"
        cols = red_columns(backend.render())
        assert cols.mean() > 48 + 4  # pixels moved right too

        assert backend.apply("rotateleft")  # box now on the right
        right, forward = geometry.relative(backend.pose(), target.x, target.z)
        assert geometry.direction(right, forward) == "right"
        assert red_columns(backend.render()).size == 0  # out of view
        assert backend.apply("rotateleft")
        right, forward = geometry.relative(backend.pose(), target.x, target.z)
        assert geometry.direction(right, forward) == "back"
        assert next(o for o in backend.objects() if o.id == "red_box_0").visible is False
    finally:
        backend.close()


def test_walls_block_moves_and_look_limits():
    backend, _ = one_room_backend(SMALL)
    try:
        backend.apply("rotateright")  # face -x... then walk into the west wall
        start = backend.agent_state()
        moved = [backend.apply("moveahead") for _ in range(12)]
        assert moved.count(True) == 6 and moved[-1] is False  # 3.25 m to the wall, 0.5 m steps
        assert backend.pose().x == pytest.approx(0.25)
        assert backend.agent_state() != start
        assert [backend.apply("lookdown") for _ in range(3)] == [True, True, False]
        assert [backend.apply("lookup") for _ in range(4)] == [True, True, True, False]
        assert backend.pose().horizon == -30.0
    finally:
        backend.close()


def test_furniture_blocks_the_oracle_path():
    backend, task = one_room_backend(SMALL)
    try:
        # the box stands 3.5 m ahead: walking straight on is blocked in front of it
        moves = [backend.apply("moveahead") for _ in range(8)]
        assert False in moves
        target = next(o for o in backend.objects() if o.id == "red_box_0")
        assert geometry.floor_distance(backend.pose(), target) >= target_radius_clearance()
    finally:
        backend.close()


def target_radius_clearance() -> float:
    return _size("box", "red")[0] + 0.2 - 1e-6


def test_collision_grid_matches_miniworld_walls_and_objects():
    env = make(task_set="long_horizon")
    try:
        env.reset(21)
        backend = env.backend
        world, layout = backend.world, backend.layout
        assert len(layout.rooms) >= 2 and layout.doors
        checked = 0
        for i in range(backend._grid.shape[0]):
            for j in range(backend._grid.shape[1]):
                x, z = i * 0.125, j * 0.125
                if not any(r.contains(x, z) for r in layout.rooms):
                    continue
                hit = world.intersect(world.agent, np.array([x, 0.0, z]), 0.2)
                assert backend._is_free(x, z) == (not hit), (x, z)
                checked += 1
        assert checked > 500
        # some doorway is passable: a move crossing a shared wall exists in the free graph
        door = layout.doors[0]
        cx, cz = door.center
        if door.axis == "z":
            a, b = backend.xz_cell(cx - 0.25, cz - 0.25), backend.xz_cell(cx + 0.25, cz - 0.25)
        else:
            a, b = backend.xz_cell(cx - 0.25, cz - 0.25), backend.xz_cell(cx - 0.25, cz + 0.25)
        assert backend.passable(a, b)
    finally:
        env.close()


# ---- step rules ----------------------------------------------------------------------------


@pytest.fixture(scope="module")
def env():
    e = make()
    yield e
    e.close()


def test_invalid_actions_are_reported_not_raised(env):
    env.reset(1)
    tr = env.step([Action("rotateleft"), Action("jump"), Action("rotateleft")])
    assert tr.actions_executed == 1
    assert len(tr.invalid_actions) == 1 and tr.invalid_actions[0].startswith("jump")
    tr = env.step([Action("RotateLeft")] * 7)  # case-insensitive names, 5 per turn at most
    assert tr.actions_executed == 5 and len(tr.invalid_actions) == 2
    assert "Executed" in tr.observation.text


def test_bad_seeds_are_refused(env):
    for seed in (-1, True, 1.5, "3"):
        with pytest.raises(EnvError) as err:
            env.reset(seed)
        assert err.value.code == "INVALID_ARGUMENT"
    assert env.reset(np.int64(3)).ground_truth == env.reset(3).ground_truth


def test_unsatisfiable_config_is_the_clients_error():
    e = make(success_distance=9.0)  # no room is big enough to start 10 m away
    try:
        with pytest.raises(EnvError) as err:
            e.reset(0)
        assert err.value.code == "INVALID_ARGUMENT" and "success_distance" in err.value.message
        with pytest.raises(EnvError) as err:
            e.step([Action("moveahead")])
        assert err.value.code == "FAILED_PRECONDITION"
    finally:
        e.close()


def test_truncation_after_the_action_budget(env):
    env.reset(2)
    trs = [env.step([Action("rotateleft")] * 5) for _ in range(6)]
    assert [t.truncated for t in trs] == [False] * 5 + [True]
    assert trs[-1].reward == 0.0 and not trs[-1].success and env.actions_taken == 30
    with pytest.raises(EnvError) as err:
        env.step([Action("moveahead")])
    assert err.value.code == "FAILED_PRECONDITION"


def test_turn_limit_truncates():
    e = make(max_turns=2)
    try:
        e.reset(3)
        assert not e.step([Action("lookdown")]).truncated
        assert e.step([Action("lookup")]).truncated
    finally:
        e.close()


def test_representations(env):
    obs = env.reset(4)
    gt = obs.ground_truth
    structured = json.loads(env.describe(gt, Representation.STRUCTURED))
    target = gt["target"]
    assert structured["agent"] == [0.0, 0.0]
    assert structured[target["type"]] == target["position"]
    natural = env.describe(gt, Representation.NATURAL)
    assert natural.startswith(f"The {target['type']} (your target) is {target['distance']:.2f} m")
    symbolic = env.describe(gt, Representation.SYMBOLIC)
    assert "A" in symbolic and "T = " in symbolic
    assert env.grading.anchor == "agent" and env.grading.tolerance > 0
    for fmt in ResponseFormat:  # VAGEN main's formats name VAGEN main's spellings
        assert ("move_forward" if fmt.value.startswith("vagen_") else "moveahead") in (
            env.system_prompt(fmt)
        )


def test_natural_phrases():
    assert geometry.direction_phrase(-0.9, 2.1) == "ahead, slightly to the left"
    assert geometry.direction_phrase(0.0, 2.0) == "ahead"
    assert geometry.direction_phrase(2.0, 0.5) == "to your right"
    assert geometry.direction_phrase(-2.0, -0.1) == "to your left"
    assert geometry.direction_phrase(0.3, -2.0) == "behind you"


def test_registry_makes_navigation():
    assert "navigation" in registry.available()
    e = registry.make("navigation", {"image_size": SMALL, "task_set": "common_sense"})
    try:
        assert e.reset(0).images[0].shape == (SMALL, SMALL, 3)
    finally:
        e.close()
    with pytest.raises(pydantic.ValidationError):
        registry.make_config("navigation", {"task_set": "nope"})


# ---- AI2-THOR: what runs without its build -----------------------------------------------


def test_ai2thor_unavailable_fails_at_once(monkeypatch, tmp_path):
    """No build: refused before any download is tried (no connection at all), rather
    than after a download times out."""
    monkeypatch.delenv(thor.EXECUTABLE_ENV, raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))  # no ~/.ai2thor build
    tried: list[object] = []

    def no_network(*args, **kwargs):
        tried.append(args)
        raise OSError("this test allows no connection")

    monkeypatch.setattr(socket, "create_connection", no_network)
    monkeypatch.setattr(socket.socket, "connect", no_network)
    with pytest.raises(EnvError) as err:
        NavigationEnv(NavigationConfig(backend="ai2thor"))
    assert tried == []
    assert err.value.code == "UNAVAILABLE"
    assert thor.EXECUTABLE_ENV in err.value.message and "miniworld" in err.value.message
    monkeypatch.setenv(thor.EXECUTABLE_ENV, str(tmp_path / "thor-Linux64-missing"))
    with pytest.raises(EnvError) as err:
        NavigationEnv(NavigationConfig(backend="ai2thor"))
    assert err.value.code == "UNAVAILABLE" and "thor-Linux64-missing" in err.value.message


def test_ai2thor_action_mapping_and_pose():
    assert set(thor.ACTION_MAP) == set(
        NavigationEnv(NavigationConfig(image_size=SMALL)).action_space.names
    )
    assert thor.ACTION_MAP["moveahead"] == {"action": "MoveAhead", "moveMagnitude": 0.5}
    assert thor.ACTION_MAP["rotateleft"] == {"action": "RotateLeft", "degrees": 90.0}
    assert thor.ACTION_MAP["lookdown"] == {"action": "LookDown", "degrees": 30.0}
    # Unity: yaw 90 faces +x, and +z is then on the left (left-handed, y up)
    pose = thor.thor_pose({"x": 1.0, "y": 0.9, "z": 2.0}, 90.0, 0.0)
    right, forward = geometry.relative(pose, 3.0, 2.0)
    assert forward == pytest.approx(2.0) and right == pytest.approx(0.0, abs=1e-9)
    right, forward = geometry.relative(pose, 1.0, 3.0)
    assert geometry.direction(right, forward) == "left"


PAPER_TASK = {
    "targetObjectType": "Bread",
    "targetObjectIds": "Bread|+01.30|+00.98|-01.53",
    "target_position": {"x": 1.3, "y": 0.98, "z": -1.53},
    "agentPose": {"position": {"x": -1.5, "y": 0.9, "z": -0.9}, "rotation": 90.0, "horizon": 0.0},
    "scene": "FloorPlan11",
    "object_to_hide": [],
    "instruction": "navigate to the Bread in the room and be as close as possible to it",
}


def test_task_file_of_the_papers_shape(tmp_path):
    task = {
        "targetObjectType": "Bread",
        "targetObjectIds": "Bread|+01.30|+00.98|-01.53",
        "target_position": {"x": 1.3, "y": 0.98, "z": -1.53},
        "agentPose": {
            "position": {"x": -1.5, "y": 0.9, "z": -0.9},
            "rotation": 90.0,
            "horizon": 0.0,
        },
        "scene": "FloorPlan11",
        "object_to_hide": [],
        "instruction": "navigate to the Bread in the room and be as close as possible to it",
    }
    path = tmp_path / "base.json"
    path.write_text(json.dumps({"tasks": [task, {**task, "scene": "FloorPlan12"}]}))
    tasks = load_task_file(path, "base")
    assert [t.scene for t in tasks] == ["FloorPlan11", "FloorPlan12"]
    assert tasks[0].agent_position == (-1.5, 0.9, -0.9) and tasks[0].agent_rotation == 90.0
    assert tasks[0].target_id.startswith("Bread|") and tasks[0].target_type == "Bread"
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"tasks": [{"scene": "FloorPlan1"}]}))
    with pytest.raises(EnvError) as err:
        load_task_file(bad)
    assert err.value.code == "INVALID_ARGUMENT" and "task 0" in err.value.message


def test_ai2thor_tasks_come_from_config_or_the_servers_task_folder(monkeypatch, tmp_path):
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.delenv(thor.EXECUTABLE_ENV, raising=False)
    tasks = {"tasks": [PAPER_TASK]}
    cfg = NavigationConfig(backend="ai2thor", task_set="common_sense", ai2thor_tasks=tasks)
    assert thor.given_tasks(cfg)[0].scene == "FloorPlan11"
    assert thor.given_tasks(cfg)[0].task_set == "common_sense"
    with pytest.raises(EnvError) as err:  # valid tasks, but no build here
        NavigationEnv(cfg)
    assert err.value.code == "UNAVAILABLE"
    with pytest.raises(EnvError) as err:  # bad tasks are the client's error, whatever the build
        NavigationEnv(NavigationConfig(backend="ai2thor", ai2thor_tasks={"tasks": [{"scene": 1}]}))
    assert err.value.code == "INVALID_ARGUMENT"

    named = NavigationConfig(backend="ai2thor", ai2thor_task_file="base.json")
    monkeypatch.delenv(thor.TASK_DIR_ENV, raising=False)
    with pytest.raises(EnvError) as err:
        thor.given_tasks(named)
    assert err.value.code == "INVALID_ARGUMENT" and thor.TASK_DIR_ENV in err.value.message
    monkeypatch.setenv(thor.TASK_DIR_ENV, str(tmp_path))
    (tmp_path / "base.json").write_text(json.dumps(tasks))
    assert thor.given_tasks(named)[0].target_type == "Bread"
    for name in ("../base.json", "/etc/passwd", "missing.json"):
        with pytest.raises(EnvError) as err:
            thor.given_tasks(NavigationConfig(backend="ai2thor", ai2thor_task_file=name))
        assert err.value.code == "INVALID_ARGUMENT"
    assert "ai2thor_executable" not in NavigationConfig.model_fields  # the operator's choice only


# ---- end to end over a real server ---------------------------------------------------------


def test_e2e_rest_session_oracle_to_success(start_visenv_server):
    server = start_visenv_server(workers=1, envs="navigation")
    config = {"task_set": "base", "image_size": SMALL}
    local = make(**config)
    try:
        with server.client() as c:
            bad = c.post(
                "/v1/sessions", json={"env": "navigation", "config": {"backend": "ai2thor"}}
            )
            assert bad.status_code == 503 and bad.json()["error"]["code"] == "UNAVAILABLE"
            reply = c.post("/v1/sessions", json={"env": "navigation", "config": config, "seed": 8})
            assert reply.status_code == 200, reply.text
            reply = reply.json()
            sid = reply["session_id"]
            obs = local.reset(8)
            assert reply["observation"]["ground_truth"] == json.loads(json.dumps(obs.ground_truth))
            for step_index in range(10):
                actions = local.oracle_actions()
                tr = local.step(actions)
                body = {"step_index": step_index, "actions": [a.to_json() for a in actions]}
                reply = c.post(f"/v1/sessions/{sid}/step", json=body)
                assert reply.status_code == 200, reply.text
                reply = reply.json()
                assert (
                    reply["observation"]["ground_truth"]["target"]
                    == tr.observation.ground_truth["target"]
                )
                if reply["terminated"] or reply["truncated"]:
                    break
            assert reply["success"] and reply["terminated"]
            assert reply["reward_parts"]["env"] == 10.0
            assert c.delete(f"/v1/sessions/{sid}").status_code == 200
            assert c.get("/health").status_code == 200
    finally:
        local.close()


# ---- grading descriptions (used by reasoning/ through grade_description) ----------------------


def test_grade_description_per_representation(env):
    from env_server.reasoning import check_representation, grade_for_env

    for seed in (0, 4, 9):
        gt = env.reset(seed).ground_truth
        truth = json.loads(env.describe(gt, Representation.STRUCTURED))
        for rep in Representation:
            check_representation(env, rep)  # symbolic too: navigation grades it itself
            text = env.describe(gt, rep)
            score = grade_for_env(env, text, truth, rep)
            in_grid = any(
                geometry.symbolic_cell(*e["position"]) for e in [gt["target"], *gt["objects"]]
            )
            assert score == 1.0 or (rep is Representation.SYMBOLIC and not in_grid), (rep, text)
    truth = {"agent": [0.0, 0.0], "red box": [-0.5, 2.3], "barrel": [1.8, 0.2]}
    grade = env.grade_description
    assert grade("nothing to see", truth, Representation.NATURAL) == 0.0
    right = "The red box is 2.36 m ahead, slightly to the left. The barrel is 1.80 m to your right."
    assert grade(right, truth, Representation.NATURAL) == 1.0
    wrong_side = "The red box is 2.36 m behind you. The barrel is 1.80 m to your left."
    assert grade(wrong_side, truth, Representation.NATURAL) == pytest.approx(0.5)
    hallucinated = right + " The chair is 1.00 m ahead."
    assert grade(hallucinated, truth, Representation.NATURAL) < 1.0
    assert (
        grade('{"red box": [-0.4, 2.0], "barrel": [1.8, 0.2]}', truth, Representation.STRUCTURED)
        == 1.0
    )
    assert grade("{'red box': (-0.4, 4.0)}", truth, Representation.STRUCTURED) == pytest.approx(
        0.5 / 1.5
    )
