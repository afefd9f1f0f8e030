"""EnvService in-process (real worker processes, no HTTP): routing, retries, failures."""

from __future__ import annotations

import asyncio

import pytest

from env_server.service import EnvService, ServiceError, SessionReply, Settings
from env_server.service.images import decode_image
from env_server.testing import TINY_PATH, TinyEnv

# the test environment, by the import path the worker processes load it from
TINY = {TinyEnv.name: TINY_PATH}


@pytest.fixture(scope="module")
def service(run) -> EnvService:
    svc = EnvService(Settings(workers=2, envs=["tiny", "sokoban"], env_paths=TINY, max_sessions=40))
    run(svc.start())
    yield svc
    run(svc.stop())


def right(session_id: str, index: int, name: str = "Right") -> dict:
    return {"session_id": session_id, "step_index": index, "actions": [{"name": name}]}


def test_list_envs_marks_enabled_and_unavailable(run, service):
    specs = {s.name: s for s in run(service.list_envs())}
    assert specs["tiny"].enabled and specs["tiny"].action_space["names"][:2] == ["Left", "Right"]
    assert specs["tiny"].config_schema["properties"]["length"]["maximum"] == 32
    assert not specs["frozenlake"].enabled  # not asked for
    assert run(service.create([{"env": "frozenlake"}]))[0].code == "NOT_FOUND"


def test_create_places_on_least_loaded_worker_and_replies(run, service):
    replies = run(service.create([{"env": "tiny", "seed": s} for s in range(4)]))
    assert all(isinstance(r, SessionReply) for r in replies)
    assert sorted(len(w.sessions) for w in service.workers) == [2, 2]
    first = replies[1]
    assert first.step_index == 0 and first.episode == 0 and first.system_prompt
    assert first.observation.ground_truth == {"player": [0, 1], "goal": [0, 3]}
    assert decode_image(first.observation.images[0]).shape == (8, 32, 3)
    assert run(service.close([r.session_id for r in replies])) == [None] * 4


def test_concurrent_duplicate_steps_apply_once(run, service):
    (reply,) = run(service.create([{"env": "tiny", "seed": 0}]))
    sid = reply.session_id

    async def twice():
        return await asyncio.gather(service.step([right(sid, 0)]), service.step([right(sid, 0)]))

    (a,), (b,) = run(twice())
    assert a is b and a.step_index == 1  # the second is answered from memory
    assert a.observation.ground_truth["player"] == [0, 1]
    (dup,) = run(service.step([right(sid, 1), right(sid, 1)]))[1:]
    assert dup.code == "INVALID_ARGUMENT" and "twice" in dup.message
    (got,) = run(service.get([sid]))
    assert got.step_index == 2 and got.observation.ground_truth["player"] == [0, 2]
    run(service.close([sid]))


def test_capacity_in_a_batch(run, service):
    open_now = len(service.sessions)
    replies = run(service.create([{"env": "tiny"}] * (41 - open_now)))
    codes = [r.code if isinstance(r, ServiceError) else "ok" for r in replies]
    assert codes[-1] == "CAPACITY" and codes.count("ok") == 40 - open_now
    run(service.close([r.session_id for r in replies if isinstance(r, SessionReply)]))
    assert len(service.sessions) == open_now


def test_worker_exit_mid_request_loses_only_its_sessions(run, service):
    replies = run(service.create([{"env": "tiny"} for _ in range(4)]))
    ids = [r.session_id for r in replies]
    doomed = service.sessions[ids[0]].worker
    mates = [s for s in ids if service.sessions[s].worker is doomed]
    others = [s for s in ids if s not in mates]
    # the worker dies while it answers this very batch
    results = run(service.step([right(ids[0], 0, "Exit"), *[right(s, 0) for s in ids[1:]]]))
    by_id = dict(zip(ids, results, strict=True))
    assert all(by_id[s].code == "SESSION_LOST" for s in mates)
    assert all(isinstance(by_id[s], SessionReply) for s in others)
    assert run(service.get(mates))[0].code == "SESSION_LOST"
    assert all(
        isinstance(r, SessionReply) for r in run(service.step([right(s, 1) for s in others]))
    )
    assert service.worker_restarts == 1

    async def replaced():
        while not all(w.alive for w in service.workers):
            await asyncio.sleep(0.05)

    run(asyncio.wait_for(replaced(), 30))
    assert doomed.pid not in [w.pid for w in service.workers]
    fresh = run(service.create([{"env": "tiny"}] * 2))
    assert all(isinstance(r, SessionReply) for r in fresh)
    run(service.close(others + [r.session_id for r in fresh]))


def test_idle_reaping_closes_only_idle_sessions(run, service):
    a, b = (r.session_id for r in run(service.create([{"env": "tiny"}] * 2)))
    service.sessions[a].last_used -= 100
    assert run(service.reap_idle(50)) == [a]
    assert "idle" in run(service.get([a]))[0].message
    assert isinstance(run(service.get([b]))[0], SessionReply)
    run(service.close([b]))


def test_a_reaped_session_says_it_was_idle_while_its_close_waits_for_a_busy_worker(run):
    """The reason is recorded when the session is forgotten, not after the close: a GET
    meanwhile said "was closed", as if a client had closed it (seen in the soak)."""

    async def main():
        svc = EnvService(Settings(workers=1, envs=["tiny"], env_paths=TINY))
        await svc.start()
        try:
            (idle,) = await svc.create([{"env": "tiny"}])
            svc.sessions[idle.session_id].last_used -= 100
            slow = asyncio.ensure_future(
                svc.create([{"env": "tiny", "config": {"reset_delay": 1.0}}])
            )
            worker = svc.workers[0]
            for _ in range(1000):  # until the slow create is on the worker (bounded)
                if worker._in_flight:
                    break
                await asyncio.sleep(0.01)
            reaping = asyncio.ensure_future(svc.reap_idle(50))
            for _ in range(1000):  # until the reaper has forgotten it (bounded)
                if isinstance(svc.sessions.lookup(idle.session_id), ServiceError):
                    break
                await asyncio.sleep(0.01)
            (answer,) = await svc.get([idle.session_id])
            assert not reaping.done()  # its close still waits behind the slow create
            assert isinstance(answer, ServiceError) and "idle" in answer.message, answer
            assert await reaping == [idle.session_id]
            (made,) = await slow
            await svc.close([made.session_id])
        finally:
            await svc.stop()

    run(main())


def test_guard_penalises_a_repeated_low_scoring_response(run, service):
    guard = {"top_k": 1, "window": 10, "min_count": 2, "threshold": 0.99, "penalty": 0.25}
    replies = run(service.create([{"env": "sokoban", "seed": s, "reasoning": {"guard": guard}}
                                  for s in range(3)]))  # fmt: skip
    # a well-formed response whose description is wrong: it scores low
    text = ("<think><observation>The box is above the player.</observation><reasoning>r"
            "</reasoning><prediction>The box is above the player.</prediction></think>"
            "<answer>Up</answer>")  # fmt: skip
    penalties = []
    for reply in replies:
        (out,) = run(service.step([{"session_id": reply.session_id, "step_index": 0,
                                     "response": text}]))  # fmt: skip
        assert out.info["parse_error"] is None
        penalties.append(out.reward_parts.penalty)
        assert out.reward == pytest.approx(
            out.reward_parts.env + out.reward_parts.format + out.reward_parts.observation
            + out.reward_parts.prediction + out.reward_parts.penalty
        )  # fmt: skip
    assert penalties == [0.0, -0.25, -0.25]
    run(service.close([r.session_id for r in replies]))


def test_metrics_count_steps_and_errors(run, service):
    (reply,) = run(service.create([{"env": "tiny"}]))
    run(service.step([right(reply.session_id, 0), right("s-nope", 0)]))
    text = service.metrics.render().decode()
    assert 'visenv_steps_total{env="tiny"}' in text
    assert 'visenv_errors_total{code="NOT_FOUND"}' in text
    assert "visenv_step_call_seconds_count" in text
    run(service.close([reply.session_id]))


def test_settings_from_environment(monkeypatch):
    monkeypatch.setenv("VISENV_ENVS", "sokoban, frozenlake")
    monkeypatch.setenv("VISENV_WORKERS", "3")
    monkeypatch.setenv("VISENV_TOKEN", "")
    settings = Settings()
    assert settings.envs == ["sokoban", "frozenlake"] and settings.workers == 3
    assert settings.token is None and settings.port == 8000 and settings.grpc_port == 50051
    assert settings.idle_timeout > 0  # reaping is on by default


def test_a_cancelled_caller_leaves_the_step_recorded(run, service):
    (reply,) = run(service.create([{"env": "tiny", "seed": 0}]))
    sid = reply.session_id

    async def give_up():
        task = asyncio.create_task(service.step([right(sid, 0)]))
        await asyncio.sleep(0)  # the step is on its way to the worker
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        return await service.get([sid])  # waits for the step in flight

    (got,) = run(asyncio.wait_for(give_up(), 20))
    assert got.step_index == 1 and got.observation.ground_truth["player"] == [0, 1]
    (retry,) = run(service.step([right(sid, 0)]))  # the client's retry: from memory
    assert retry is got
    run(service.close([sid]))
