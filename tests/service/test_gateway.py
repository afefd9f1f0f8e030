"""The gateway (`visenv serve --upstream ...`, compose's `envs` service) end to end:
two real family servers behind one real gateway process, over REST and gRPC."""

from __future__ import annotations

import os
import signal
import time

import pytest

from clients import EnvClient, SessionLost

RESPONSE = "<answer>{}</answer>"


@pytest.fixture
def family_servers(start_visenv_server):
    sokoban = start_visenv_server(
        workers=1, envs="sokoban", token="t", extra_env={"VISENV_NODE_ID": "sokoban-0"}
    )
    frozenlake = start_visenv_server(workers=1, envs="frozenlake", token="t")  # default node
    gateway = start_visenv_server(
        envs=None,
        token="t",
        upstreams=[sokoban.grpc, frozenlake.grpc],
        extra_env={"VISENV_UPSTREAM_LOST_AFTER": "1"},
    )
    return sokoban, frozenlake, gateway


def test_gateway_routes_each_env_to_its_family_and_passes_steps_through(family_servers):
    sokoban, frozenlake, gateway = family_servers
    with gateway.client() as http:
        envs = {e["name"]: e for e in http.get("/v1/envs").json()["envs"]}
        assert envs["sokoban"]["available"] and envs["frozenlake"]["available"]
        health = http.get("/health").json()
        assert health["role"] == "gateway" and health["envs"] == ["frozenlake", "sokoban"]
        # docs/wire.md: /health publishes the limits (the upstreams' strictest, as
        # /v1/limits) and, per environment, whether it is served without a warm-up
        assert health["limits"] == http.get("/v1/limits").json()
        assert health["limits"]["max_batch_items"] > 0
        assert health["ready"] == {"frozenlake": True, "sokoban": True}

        made = http.post(
            "/v1/batch/create",
            json={
                "items": [
                    {"env": "sokoban", "seed": 3, "format": "no_think"},
                    {"env": "frozenlake", "seed": 3},
                    {"env": "nosuchenv"},
                ]
            },  # fmt: skip
        ).json()["results"]
        assert made[0]["ok"] and made[1]["ok"]
        assert made[2] == {"ok": False, "error": made[2]["error"]}
        assert made[2]["error"]["code"] == "NOT_FOUND"
        sok_id, fl_id = made[0]["reply"]["session_id"], made[1]["reply"]["session_id"]

    # each session lives on its family's server, which knows it under the same id
    with sokoban.client() as s, frozenlake.client() as f:
        assert s.get(f"/v1/sessions/{sok_id}").status_code == 200
        assert f.get(f"/v1/sessions/{fl_id}").status_code == 200
        assert s.get(f"/v1/sessions/{fl_id}").status_code == 404

    # stepping through the gateway's gRPC port, with the client's step_index passed through
    client = EnvClient(gateway.grpc, token="t")
    client.attach(sok_id, gateway.grpc)
    first = client.step([sok_id], [RESPONSE.format("Left")])[0]
    client.close_client(close_sessions=False)
    assert first.step_index == 1 and first.info["actions_executed"] == 1
    with gateway.client() as http:
        # a retry of that same step (index 0) is answered from memory, not applied again
        again = http.post(f"/v1/sessions/{sok_id}/step",
                          json={"step_index": 0, "response": RESPONSE.format("Left")}).json()  # fmt: skip
        assert again["step_index"] == 1 and again["observation"] == first_obs_json(first, again)
        frame = http.get(f"/v1/sessions/{sok_id}/frame.png")
        assert frame.headers["content-type"] == "image/png" and frame.content[:4] == b"\x89PNG"
        assert http.get("/v1/sessions/s-0000000000000000").status_code == 404


def first_obs_json(first, again_json):
    """The observation JSON of a client reply, in the REST shape of `again_json`."""
    assert again_json["observation"]["text"] == first.observation.text
    return again_json["observation"]


def test_gateway_token_and_lost_upstream(family_servers):
    sokoban, frozenlake, gateway = family_servers
    with gateway.client() as http:
        assert http.get("/v1/envs", headers={"Authorization": "Bearer wrong"}).status_code == 401
        made = http.post(
            "/v1/batch/create", json={"items": [{"env": "sokoban"}, {"env": "frozenlake"}]}
        ).json()["results"]
        sok_id, fl_id = (m["reply"]["session_id"] for m in made)

        os.killpg(sokoban.proc.pid, signal.SIGKILL)
        sokoban.proc.wait(timeout=10)

        step = {"step_index": 0, "response": RESPONSE.format("Up")}
        # unreachable for a moment: retry (it may be a blip) ...
        moment = http.post(f"/v1/sessions/{sok_id}/step", json=step)
        assert moment.status_code == 503 and moment.json()["error"]["code"] == "UNAVAILABLE"
        ups = {u["node"]: u for u in http.get("/health").json()["upstreams"]}
        assert ups["sokoban-0"]["up"] is False and len(ups) == 2
        metrics = http.get("/metrics").text
        assert (
            f'visenv_gateway_upstream_up{{address="{sokoban.grpc}",node="sokoban-0"}} 0.0'
            in metrics
        )
        time.sleep(1.2)  # ... and past VISENV_UPSTREAM_LOST_AFTER its sessions are gone
        lost = http.post(f"/v1/sessions/{sok_id}/step", json=step)
        assert lost.status_code == 410 and lost.json()["error"]["code"] == "SESSION_LOST"
        fine = http.post(f"/v1/sessions/{fl_id}/step",
                         json={"step_index": 0, "response": RESPONSE.format("Down")})  # fmt: skip
        assert fine.status_code == 200 and fine.json()["step_index"] == 1
        # new sokoban sessions have nowhere to go: a clear error, not a hang
        again = http.post("/v1/sessions", json={"env": "sokoban"})
        assert again.status_code == 503 and again.json()["error"]["code"] == "UNAVAILABLE"

        # and it stays lost, over both transports
        assert http.get(f"/v1/sessions/{sok_id}").json()["error"]["code"] == "SESSION_LOST"
    with EnvClient(gateway.grpc, token="t") as client, pytest.raises(SessionLost):
        client.attach(sok_id, gateway.grpc)


def test_gateway_waits_for_upstreams_that_are_not_up_yet(start_visenv_server):
    """Started before its upstream (as on Kubernetes, with no health-gated start-up), the
    gateway starts and answers UNAVAILABLE; its refresh loop asks the upstream again."""
    import socket

    with socket.socket() as s:  # a port nothing listens on yet
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    gateway = start_visenv_server(envs=None, upstreams=[f"127.0.0.1:{port}"])
    with gateway.client() as http:
        early = http.post("/v1/sessions", json={"env": "sokoban"})
        assert early.status_code == 503 and early.json()["error"]["code"] == "UNAVAILABLE"
        assert http.get("/health").json()["envs"] == []


def test_gateway_caps_grpc_requests_at_its_own_max_request_bytes(start_visenv_server):
    """A gateway started with a smaller request limit than the default refuses a larger
    gRPC message itself (RESOURCE_EXHAUSTED), as its REST side does with 413, and serves
    one within the limit."""
    import grpc

    from visenv.v1 import visenv_pb2 as pb
    from visenv.v1 import visenv_pb2_grpc as pb_grpc

    upstream = start_visenv_server(workers=1, envs="tiny")
    gateway = start_visenv_server(envs=None, upstreams=[upstream.grpc], max_request_bytes=1 << 20)
    options = [("grpc.max_send_message_length", 64 << 20)]
    with grpc.insecure_channel(gateway.grpc, options=options) as channel:
        stub = pb_grpc.VisenvStub(channel)
        item = pb.StepItem(session_id="s-0000000000000000", step_index=0, response="x" * (2 << 20))
        with pytest.raises(grpc.RpcError) as refused:
            stub.Step(pb.StepRequest(items=[item]))
        assert refused.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        small = pb.StepItem(session_id="s-0000000000000000", step_index=0, response="x" * 1000)
        answer = stub.Step(pb.StepRequest(items=[small]))  # within the limit: answered
        assert answer.results[0].error.code == "NOT_FOUND"


def test_gateway_places_no_session_on_a_draining_upstream(start_visenv_server):
    """A drained upstream (SIGUSR1, as `visenv ray scale` drains one) gets no new session
    through the gateway, which places them on the others; its open sessions go on."""
    first, second = (start_visenv_server(workers=1, envs="sokoban") for _ in range(2))
    gateway = start_visenv_server(envs=None, upstreams=[first.grpc, second.grpc])
    with gateway.client() as http:
        made = [http.post("/v1/sessions", json={"env": "sokoban", "seed": s}) for s in range(4)]
        assert all(r.status_code == 200 for r in made), [r.text for r in made]
        os.kill(first.proc.pid, signal.SIGUSR1)
        deadline = time.monotonic() + 30
        while not any(u["draining"] for u in http.get("/health").json()["upstreams"]):
            assert time.monotonic() < deadline, "the gateway never saw the upstream draining"
            time.sleep(0.1)
        with first.client() as direct:
            held_before = direct.get("/health").json()["sessions"]
        more = [http.post("/v1/sessions", json={"env": "sokoban", "seed": s}) for s in range(6)]
        assert all(r.status_code == 200 for r in more), [r.text for r in more]  # none refused
        with first.client() as direct:
            assert direct.get("/health").json()["sessions"] == held_before
        for r in made:  # the drained upstream's sessions are still served through the gateway
            sid = r.json()["session_id"]
            stepped = http.post(f"/v1/sessions/{sid}/step",
                                json={"step_index": 0, "actions": [{"name": "Up"}]})  # fmt: skip
            assert stepped.status_code == 200, stepped.text
