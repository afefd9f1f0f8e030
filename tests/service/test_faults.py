"""Server behaviour on faults, against a real `visenv serve`, over REST and gRPC.

The `tiny` test environment (`env_server.testing.TinyEnv`) produces on demand what real
environments must never do: `Hang` never returns, seed 666 makes reset raise, seed 667
puts an object no JSON can hold into the ground truth.
"""

from __future__ import annotations

import json
import threading
import time

import pytest

from visenv.v1 import visenv_pb2 as pb


@pytest.fixture(scope="module")
def server():
    from env_server.testing.launcher import launch_server

    # a 3 s deadline for tiny (the stuck env), the default for the rest
    srv = launch_server(extra_env={"VISENV_DEADLINES": json.dumps({"tiny": 3})})
    yield srv
    srv.stop()


def _sessions(client) -> int:
    return client.get("/health").json()["sessions"]


def _metric(client, name: str) -> float:
    for line in client.get("/metrics").text.splitlines():
        if line.startswith(name + " ") or line.startswith(name + "{"):
            return float(line.rsplit(" ", 1)[1])
    return 0.0


def _wait_workers_alive(client, restarts: int = 0, timeout: float = 60) -> dict:
    """/health once every worker is alive and at least `restarts` were replaced."""
    deadline = time.monotonic() + timeout
    while True:
        health = client.get("/health").json()
        if all(w["alive"] for w in health["workers"]) and health["worker_restarts"] >= restarts:
            return health
        assert time.monotonic() < deadline, "the worker was not replaced"
        time.sleep(0.1)


@pytest.mark.parametrize("seed", [666, 667])
def test_failed_create_leaves_no_session_rest(server, seed):
    with server.client() as c:
        before = _sessions(c)
        reply = c.post("/v1/sessions", json={"env": "tiny", "seed": seed})
        assert reply.status_code == 500
        error = reply.json()["error"]
        assert error["code"] == "INTERNAL" and error["error_id"].startswith("err-")
        if seed == 667:  # caught where the reply is built, naming where the bad value sits
            assert "ground_truth.thing" in error["message"]
        assert _sessions(c) == before
        # the batch form answers that item only
        results = c.post("/v1/batch/create", json={"items": [
            {"env": "tiny", "seed": seed}, {"env": "tiny", "seed": 1},
        ]}).json()["results"]  # fmt: skip
        assert results[0]["error"]["code"] == "INTERNAL" and results[1]["ok"]
        assert _sessions(c) == before + 1
        c.delete(f"/v1/sessions/{results[1]['reply']['session_id']}")


def test_failed_create_and_reset_leave_no_session_grpc(server, stub):
    with server.client() as c:
        before = _sessions(c)
        resp = stub.Create(pb.CreateRequest(items=[
            pb.SessionOptions(env="tiny", seed=666), pb.SessionOptions(env="tiny", seed=2),
        ]), timeout=30)  # fmt: skip
        error = resp.results[0].error
        assert error.code == "INTERNAL" and error.error_id.startswith("err-")
        assert error.error_id in error.message
        sid = resp.results[1].reply.session_id
        assert _sessions(c) == before + 1
        # a reset that fails inside the environment ends that session, and says why
        reset = stub.Reset(pb.ResetRequest(items=[pb.ResetItem(session_id=sid, seed=666)]))
        assert reset.results[0].error.code == "INTERNAL"
        assert _sessions(c) == before
        again = stub.Get(pb.GetRequest(session_ids=[sid]), timeout=30)
        assert again.results[0].error.code == "SESSION_LOST"


def test_stuck_worker_is_replaced_and_its_sessions_lost(server, stub):
    with server.client() as c:
        health = _wait_workers_alive(c)
        restarts = health["worker_restarts"]
        ids = [
            c.post("/v1/sessions", json={"env": "tiny", "seed": s}).json()["session_id"]
            for s in range(4)
        ]  # fmt: skip  (two on each worker)
        started = time.monotonic()
        stuck = c.post(f"/v1/sessions/{ids[0]}/step", json={
            "step_index": 0, "actions": [{"name": "Hang"}]}, timeout=60)  # fmt: skip
        waited = time.monotonic() - started
        assert stuck.status_code == 410, stuck.text
        error = stuck.json()["error"]
        assert error["code"] == "SESSION_LOST" and "within 3 s" in error["message"]
        assert 2.5 < waited < 30
        health = _wait_workers_alive(c, restarts + 1)
        assert health["worker_restarts"] == restarts + 1
        assert _metric(c, "visenv_worker_timeouts_total") >= 1
        # the sessions of the other worker go on; those of the stuck one are lost
        codes = []
        for sid in ids[1:]:
            resp = stub.Step(pb.StepRequest(items=[pb.StepItem(
                session_id=sid, step_index=0, actions=pb.ActionList(actions=[pb.Action(name="Right")]),
            )]), timeout=30)  # fmt: skip
            item = resp.results[0]
            codes.append("OK" if item.HasField("reply") else item.error.code)
        assert sorted(codes) == ["OK", "OK", "SESSION_LOST"], codes
        fresh = c.post("/v1/sessions", json={"env": "tiny"})
        assert fresh.status_code == 200
        c.post("/v1/batch/close", json={"session_ids": ids + [fresh.json()["session_id"]]})


def test_a_call_queued_behind_a_stuck_message_says_why_its_session_ended(server, stub):
    """The worker's watchdog kills a worker stuck on one message: a call queued behind that
    message (another session on the same worker) answers SESSION_LOST naming the deadline
    too, not a bare "died"; the sessions on the other worker are answered as usual."""
    with server.client() as c:
        restarts = _wait_workers_alive(c)["worker_restarts"]
        ids = [
            c.post("/v1/sessions", json={"env": "tiny", "seed": s}).json()["session_id"]
            for s in range(4)
        ]  # fmt: skip  (the least-loaded pick: at least one more on the first one's worker)
        sent = sum(w["messages"] for w in c.get("/health").json()["workers"])
        hung: list = []
        hang = threading.Thread(target=lambda: hung.append(c.post(
            f"/v1/sessions/{ids[0]}/step",
            json={"step_index": 0, "actions": [{"name": "Hang"}]}, timeout=60,
        )))  # fmt: skip
        hang.start()
        with server.client() as probe:  # until the Hang message is sent: the next call on
            waited = time.monotonic() + 30  # its worker queues behind it
            while sum(w["messages"] for w in probe.get("/health").json()["workers"]) == sent:
                assert time.monotonic() < waited, "the Hang step was never sent"
                time.sleep(0.02)
        resp = stub.Step(pb.StepRequest(items=[pb.StepItem(
            session_id=sid, step_index=0, actions=pb.ActionList(actions=[pb.Action(name="Right")]),
        ) for sid in ids[1:]]), timeout=30)  # fmt: skip
        hang.join(timeout=60)
        assert hung and hung[0].status_code == 410, hung
        errors = [r.error for r in resp.results if not r.HasField("reply")]
        assert errors, "no other session shared the stuck worker"
        for error in errors:
            assert error.code == "SESSION_LOST", error
            assert "did not answer step within 3 s" in error.message, error.message
        _wait_workers_alive(c, restarts + 1)
        c.post("/v1/batch/close", json={"session_ids": ids})


def test_unexpected_api_error_is_internal_with_an_id(server):
    """An error in the API process itself (not the worker): a gRPC request whose JSON
    config is not an object is INVALID_ARGUMENT (a bad request, not a bug); malformed
    protobuf bytes are refused by gRPC before our code; a REST body that is not JSON is
    INVALID_ARGUMENT. None of these is a 500."""
    with server.client() as c:
        bad = c.post("/v1/sessions", content=b"\xff\xfe not json")
        assert bad.status_code == 422 and bad.json()["error"]["code"] == "INVALID_ARGUMENT"
