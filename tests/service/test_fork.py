"""Session fork in EnvService (real worker processes, real environments)."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from env_server.service import EnvService, ServiceError, SessionReply, Settings
from env_server.service.images import decode_image
from env_server.testing import TINY_PATH, TinyEnv


class NoSnapshotEnv(TinyEnv):
    """The tiny corridor, but its state can't be copied (like a simulator handle)."""

    name = "nosnap"

    def _snapshot(self) -> Any:
        raise NotImplementedError


# the worker processes import the environments by these paths (the repository root is on
# their sys.path, as on pytest's: pyproject's `pythonpath`)
PATHS = {"tiny": TINY_PATH, "nosnap": "tests.service.test_fork:NoSnapshotEnv"}
REAL = ["sokoban", "frozenlake", "svg", "vicrit", "navigation", "primitive_skill"]
# vicrit under unary feedback: a wrong answer keeps the episode going (and a repeat is
# penalised: the attempts so far are part of the forked state)
CONFIG = {"vicrit": {"feedback": "unary", "max_attempts": 3}}
CAP = 30
# two turns per environment, as a model would write them (grounding_worldmodeling format)
TURNS = {
    "sokoban": ["Left, Up", "Right"],
    "frozenlake": ["Right", "Down"],
    "svg": [
        "<svg xmlns='http://www.w3.org/2000/svg' width='64' height='64'>"
        "<circle cx='32' cy='32' r='20' fill='red'/></svg>",
        "<svg xmlns='http://www.w3.org/2000/svg' width='64' height='64'>"
        "<rect x='8' y='8' width='40' height='40' fill='blue'/></svg>",
    ],
    "vicrit": ["a purple elephant", "a purple elephant"],
    "navigation": ["moveahead, rotateleft", "moveahead"],
    "primitive_skill": ["pick(62, -55, 20)", "place(80, 100, 20)"],
}


def respond(answer: str) -> str:
    return (
        "<think><observation>The scene.</observation><reasoning>Go.</reasoning>"
        f"<prediction>The scene.</prediction></think><answer>{answer}</answer>"
    )


@pytest.fixture(scope="module")
def service(run) -> EnvService:
    svc = EnvService(
        Settings(workers=2, envs=["tiny", "nosnap", *REAL], env_paths=PATHS, max_sessions=CAP)
    )
    run(svc.start())
    yield svc
    run(svc.stop())


def right(session_id: str, index: int) -> dict:
    return {"session_id": session_id, "step_index": index, "actions": [{"name": "Right"}]}


def assert_same(a: SessionReply, b: SessionReply, env: str) -> None:
    """b answers as a would (primitive_skill: within its stated tolerance)."""
    assert (a.step_index, a.turn, a.episode) == (b.step_index, b.turn, b.episode)
    assert a.observation.text == b.observation.text
    assert a.reward_parts == b.reward_parts and a.reward == b.reward
    assert (a.terminated, a.truncated, a.success) == (b.terminated, b.truncated, b.success)
    assert a.info["actions"] == b.info["actions"]
    images_a = [decode_image(im) for im in a.observation.images]
    images_b = [decode_image(im) for im in b.observation.images]
    assert [im.shape for im in images_a] == [im.shape for im in images_b]
    if env != "primitive_skill":
        assert a.observation.ground_truth == b.observation.ground_truth
        assert all(np.array_equal(x, y) for x, y in zip(images_a, images_b, strict=True))
        return
    for name, pos in a.observation.ground_truth["objects"].items():
        assert np.allclose(b.observation.ground_truth["objects"][name], pos, atol=5), name
    for x, y in zip(images_a, images_b, strict=True):  # a few pixels at the settled edges
        assert np.mean(np.abs(x.astype(int) - y.astype(int)) > 0) < 0.02


@pytest.mark.parametrize("env", REAL)
def test_forks_answer_the_same_actions_as_their_source(run, service, env):
    (source,) = run(service.create([{"env": env, "seed": 1, "config": CONFIG.get(env, {})}]))
    sid = source.session_id
    (first,) = run(service.step([{"session_id": sid, "step_index": 0,
                                  "response": respond(TURNS[env][0])}]))  # fmt: skip
    (forks,) = run(service.fork([{"session_id": sid, "n": 2}]))
    assert len(forks) == 2 and len({f.session_id for f in forks} | {sid}) == 3
    fork_info = forks[0].info["fork"]
    assert fork_info["source"] == sid
    assert fork_info["exact"] == (env != "primitive_skill")
    assert (fork_info["tolerance"] is None) == fork_info["exact"]
    for fork in forks:  # the source's state: its last reply under the fork's id
        assert fork.step_index == first.step_index == 1
        assert fork.observation.text == first.observation.text
        assert fork.reward == first.reward
        assert service.sessions[fork.session_id].worker is service.sessions[sid].worker
    ids = [sid] + [f.session_id for f in forks]
    replies = run(service.step([{"session_id": i, "step_index": 1,
                                 "response": respond(TURNS[env][1])} for i in ids]))  # fmt: skip
    assert all(isinstance(r, SessionReply) for r in replies), replies
    for reply in replies[1:]:
        assert_same(replies[0], reply, env)
    assert run(service.close(ids)) == [None] * 3


def test_a_forks_steps_leave_its_source_alone(run, service):
    (source,) = run(service.create([{"env": "tiny", "seed": 0, "config": {"length": 8}}]))
    sid = source.session_id
    run(service.step([right(sid, 0)]))
    (forks,) = run(service.fork([{"session_id": sid, "n": 1}]))
    fid = forks[0].session_id
    for index in (1, 2, 3):
        (reply,) = run(service.step([right(fid, index)]))
        assert reply.observation.ground_truth["player"] == [0, 1 + index]
    (still,) = run(service.get([sid]))
    assert still.step_index == 1 and still.observation.ground_truth["player"] == [0, 1]
    (moved,) = run(service.step([right(sid, 1)]))
    assert moved.observation.ground_truth["player"] == [0, 2]
    (fork_now,) = run(service.get([fid]))
    assert fork_now.step_index == 4 and fork_now.observation.ground_truth["player"] == [0, 4]
    # a retried step on a fork is answered from the memory it inherited
    (again,) = run(service.fork([{"session_id": sid}]))
    (retry,) = run(service.step([right(again[0].session_id, 1)]))
    assert retry.session_id == again[0].session_id and retry.step_index == 2
    (fresh,) = run(service.step([right(again[0].session_id, 2)]))
    assert fresh.observation.ground_truth["player"] == [0, 3]
    run(service.close([sid, fid, again[0].session_id]))


def test_fork_over_capacity_is_refused_whole(run, service):
    (source,) = run(service.create([{"env": "tiny"}]))
    sid = source.session_id
    before = len(service.sessions)
    room = CAP - before
    (refused,) = run(service.fork([{"session_id": sid, "n": room + 1}]))
    assert isinstance(refused, ServiceError) and refused.code == "CAPACITY"
    assert refused.field == "n" and str(room) in refused.message
    assert len(service.sessions) == before
    # in one batch: the first item takes the room, the second is refused whole
    made, over = run(service.fork([{"session_id": sid, "n": room - 1},
                                   {"session_id": "s-x", "n": 1}]))  # fmt: skip
    assert len(made) == room - 1 and over.code == "NOT_FOUND"
    (last,) = run(service.create([{"env": "tiny"}]))
    two = run(service.fork([{"session_id": last.session_id, "n": 1}]))[0]
    assert two.code == "CAPACITY"
    run(service.close([sid, last.session_id] + [r.session_id for r in made]))
    assert len(service.sessions) == before - 1


def test_bad_fork_items_get_their_own_errors(run, service):
    (source,) = run(service.create([{"env": "tiny"}]))
    sid = source.session_id
    zero, unknown, ok, missing = run(
        service.fork(
            [
                {"session_id": sid, "n": 0},
                {"session_id": "s-none", "n": 1},
                {"session_id": sid, "n": 1},
                {"n": 1},
            ]
        )  # fmt: skip
    )
    assert zero.code == "INVALID_ARGUMENT" and zero.field == "n"
    assert unknown.code == "NOT_FOUND" and isinstance(ok, list)
    assert missing.code == "INVALID_ARGUMENT" and missing.field == "session_id"
    (twice,) = run(service.fork([{"session_id": sid}, {"session_id": sid}]))[1:]
    assert twice.code == "INVALID_ARGUMENT" and "twice" in twice.message
    run(service.close([sid, ok[0].session_id]))


def test_an_env_that_cant_snapshot_answers_failed_precondition(run, service):
    (source,) = run(service.create([{"env": "nosnap"}]))
    before = len(service.sessions)
    (err,) = run(service.fork([{"session_id": source.session_id, "n": 3}]))
    assert err.code == "FAILED_PRECONDITION" and "'nosnap'" in err.message
    assert len(service.sessions) == before
    assert sum(len(w.sessions) for w in service.workers) == before
    run(service.close([source.session_id]))


def test_forks_are_closed_and_reaped_like_any_session(run, service):
    (source,) = run(service.create([{"env": "tiny"}]))
    sid = source.session_id
    (forks,) = run(service.fork([{"session_id": sid, "n": 3}]))
    a, b, c = (f.session_id for f in forks)
    assert run(service.close([a])) == [None]
    assert run(service.get([a]))[0].code == "NOT_FOUND"
    service.sessions[b].last_used -= 100
    assert run(service.reap_idle(50)) == [b]
    assert "idle" in run(service.get([b]))[0].message
    assert isinstance(run(service.get([c]))[0], SessionReply)  # the others go on
    health = run(service.health())
    assert health["sessions"] == len(service.sessions)
    worker = service.sessions[sid].worker
    assert {sid, c} <= worker.sessions and not {a, b} & worker.sessions
    run(service.close([sid, c]))


def test_a_fork_gets_a_copy_of_the_guard_window_never_the_same_one(run, service):
    guard = {"top_k": 1, "window": 10, "min_count": 3, "threshold": 0.99, "penalty": 0.25}
    text = ("<think><observation>The box is above the player.</observation><reasoning>r"
            "</reasoning><prediction>The box is above the player.</prediction></think>"
            "<answer>Up</answer>")  # fmt: skip
    (source,) = run(service.create([{"env": "sokoban", "seed": 5, "config": {"max_turns": 20},
                                     "reasoning": {"guard": guard}}]))  # fmt: skip
    sid = source.session_id

    def step(session_id: str, index: int) -> float:
        (out,) = run(service.step([{"session_id": session_id, "step_index": index,
                                    "response": text}]))  # fmt: skip
        return out.reward_parts.penalty

    assert step(sid, 0) == 0.0  # seen once
    (forks,) = run(service.fork([{"session_id": sid, "n": 2}]))
    f1, f2 = (f.session_id for f in forks)
    # each copy has seen it once: twice now, under min_count (a shared window: 3 and 4)
    assert [step(f1, 1), step(f2, 1), step(sid, 1)] == [0.0, 0.0, 0.0]
    assert step(f1, 2) == -0.25  # three times in f1's copy (a fresh guard: twice)
    guards = {id(service.rewards.guard_of(service.sessions[s])) for s in (sid, f1, f2)}
    assert len(guards) == 3
    run(service.close([sid, f1, f2]))
