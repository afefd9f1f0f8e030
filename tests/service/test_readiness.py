"""Readiness means served: an environment /health reports ready answers at once, even while
a heavy one (primitive_skill: ~10 s of simulator start-up and shader compilation on
lavapipe) is still warming up in the same worker; gRPC health says the same."""

from __future__ import annotations

import time

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

SERVING = health_pb2.HealthCheckResponse.SERVING


def _grpc_ready(channel: grpc.Channel, env: str) -> bool:
    stub = health_pb2_grpc.HealthStub(channel)
    try:
        reply = stub.Check(health_pb2.HealthCheckRequest(service=f"visenv.env.{env}"), timeout=5)
    except grpc.RpcError as exc:  # not registered yet: the server is still starting
        assert exc.code() == grpc.StatusCode.NOT_FOUND, exc
        return False
    return reply.status == SERVING


def test_a_light_env_reported_ready_is_served_while_a_heavy_one_warms(start_visenv_server):
    server = start_visenv_server(
        workers=1, envs="sokoban,primitive_skill", ready="answers", timeout=180
    )
    with server.client() as http, grpc.insecure_channel(server.grpc) as channel:
        deadline = time.monotonic() + 120
        while not (ready := http.get("/health").json()["ready"]).get("sokoban"):
            assert time.monotonic() < deadline, ready
            time.sleep(0.05)
        reported = time.monotonic()
        assert ready == {"sokoban": True, "primitive_skill": False}  # it warms behind us
        created = http.post("/v1/sessions", json={"env": "sokoban", "seed": 3})
        assert created.status_code == 200, created.text
        sid = created.json()["session_id"]
        step = http.post(f"/v1/sessions/{sid}/step", json={"step_index": 0, "response": "<answer>Up</answer>"})  # fmt: skip
        assert step.status_code == 200, step.text
        served_in = time.monotonic() - reported
        # answered while primitive_skill still warms: the step did not wait behind it
        health = http.get("/health").json()
        assert health["ready"]["primitive_skill"] is False, (served_in, health["workers"])
        assert served_in < 1.0, served_in  # before: 12.5 s, the whole warm-up
        # gRPC health agrees with /health (it follows the same readiness, polled)
        deadline = time.monotonic() + 10
        while not _grpc_ready(channel, "sokoban"):
            assert time.monotonic() < deadline
            time.sleep(0.05)
        assert not _grpc_ready(channel, "primitive_skill")
        # and once primitive_skill is warm, both say so, and its create paid no warm-up
        deadline = time.monotonic() + 150
        while not http.get("/health").json()["ready"]["primitive_skill"]:
            assert time.monotonic() < deadline, "primitive_skill never warmed"
            time.sleep(0.2)
        deadline = time.monotonic() + 10
        while not _grpc_ready(channel, "primitive_skill"):
            assert time.monotonic() < deadline
            time.sleep(0.05)
        heavy = http.post("/v1/sessions", json={"env": "primitive_skill", "seed": 0}, timeout=120)
        assert heavy.status_code == 200, heavy.text
        assert "warm_up_s" not in heavy.json()["info"]
        http.delete(f"/v1/sessions/{sid}")
        http.delete(f"/v1/sessions/{heavy.json()['session_id']}")


def test_a_starting_server_lists_the_environments_it_will_serve():
    """Before its workers list them, /health names the environments asked for, not none:
    a client that places sessions by /health took a starting server for one offering
    nothing and put every session on the other (8 of 8 under load). Once started: the
    enabled ones."""
    import asyncio

    from env_server.core import registry
    from env_server.service import EnvService, Settings

    async def main() -> tuple[dict, dict, dict]:
        asked = EnvService(Settings(workers=1, envs=["frozenlake", "sokoban"]))
        every = EnvService(Settings(workers=1))
        before = await asked.health(), await every.health()
        async with asked:
            after = await asked.health()
        return *before, after

    asked, every, started = asyncio.run(main())
    assert asked["status"] == "starting" and asked["envs"] == ["frozenlake", "sokoban"]
    assert every["status"] == "starting" and every["envs"] == sorted(registry.names())
    assert started["status"] != "starting" and started["envs"] == ["frozenlake", "sokoban"]
