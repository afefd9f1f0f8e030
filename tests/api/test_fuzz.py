"""Fuzzing a real `visenv serve` over both transports: nothing a client sends may make the
server answer a 5xx (REST) or crash / answer a bare INTERNAL (gRPC).

REST: schemathesis reads /openapi.json, whose `links` lead from a created session to its
step/get/reset/fork/frame/close, so its stateful phase drives live sessions instead of
only ever getting 404 for made-up ids. gRPC: malformed and extreme messages by hand.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import grpc
import httpx
import pytest

from visenv.v1 import visenv_pb2 as pb
from visenv.v1 import visenv_pb2_grpc as pb_grpc

SCHEMATHESIS = Path(sys.executable).with_name("schemathesis")


@pytest.fixture(scope="module")
def servers():
    from env_server.testing.launcher import launch_servers

    # no `tiny` here: its Crash/Hang actions are deliberate server errors. Two servers:
    # the fuzzer leaves sessions open, the gRPC tests count theirs against a small cap
    both = launch_servers(
        {"envs": "sokoban,frozenlake"}, {"envs": "sokoban,frozenlake", "max_sessions": 64}
    )
    yield both
    for srv in both:
        srv.stop()


@pytest.fixture(scope="module")
def server(servers):
    return servers[0]


def test_openapi_links_lead_from_create_to_the_session_operations(server):
    schema = httpx.get(server.url + "/openapi.json").json()
    links = schema["paths"]["/v1/sessions"]["post"]["responses"]["200"]["links"]
    assert {"StepSession", "GetSession", "ResetSession", "SessionFrame", "CloseSession"} <= set(
        links
    )
    assert links["StepSession"]["parameters"]["session_id"] == "$response.body#/session_id"
    env = schema["components"]["schemas"]["SessionOptions"]["properties"]["env"]
    assert env["enum"] == ["frozenlake", "sokoban"]


def test_schemathesis_finds_no_server_error(server, tmp_path):
    cmd = [
        str(SCHEMATHESIS), "run", server.url + "/openapi.json",
        "--checks", "not_a_server_error",
        "--phases", "coverage,fuzzing,stateful",
        "--max-examples", "15", "--workers", "1", "--request-timeout", "60",
        "--exclude-path", "/metrics",
        "--seed", "7",
    ]  # fmt: skip
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600, cwd=tmp_path)
    out = proc.stdout + proc.stderr
    print(out[-3000:])
    assert proc.returncode == 0, out[-6000:]
    cases = re.search(r"(\d+) generated, (\d+) passed", out)
    assert cases and int(cases[1]) == int(cases[2]) > 300, out[-3000:]
    covered = re.search(r"API Links:\s+(\d+) covered", out)
    assert covered and int(covered[1]) >= 5, "the stateful phase never reached live sessions"
    assert server.alive


@pytest.fixture(scope="module")
def grpc_server(servers):
    return servers[1]


@pytest.fixture(scope="module")
def stub(grpc_server):
    options = [("grpc.max_receive_message_length", 64 * 1024 * 1024)]
    with grpc.insecure_channel(grpc_server.grpc, options=options) as channel:
        yield pb_grpc.VisenvStub(channel)


def _codes(response: pb.BatchResponse) -> list[str]:
    return ["OK" if r.HasField("reply") else r.error.code for r in response.results]


def test_grpc_malformed_items_get_their_own_errors(stub):
    resp = stub.Create(pb.CreateRequest(items=[
        pb.SessionOptions(env=""),                                    # empty env
        pb.SessionOptions(env="sokoban", seed=-5),                    # negative seed
        pb.SessionOptions(env="sokoban", config_json="{not json"),    # broken JSON
        pb.SessionOptions(env="sokoban", config_json="[1, 2]"),       # JSON, not an object
        pb.SessionOptions(env="sokoban", config_json='{"dim_room": [1000, 1000]}'),
        pb.SessionOptions(env="sokoban", format="nonsense"),
        pb.SessionOptions(env="\x00" * 1000),
        pb.SessionOptions(env="sokoban", seed=2**62),                 # huge seed
    ]), timeout=60)  # fmt: skip
    codes = _codes(resp)
    assert codes[0] in ("NOT_FOUND", "INVALID_ARGUMENT")
    assert codes[2] == codes[3] == codes[4] == codes[5] == "INVALID_ARGUMENT", codes
    assert codes[6] in ("NOT_FOUND", "INVALID_ARGUMENT")
    assert "INTERNAL" not in codes, resp
    made = [r.reply.session_id for r in resp.results if r.HasField("reply")]
    made += [r.reply.session_id for r in stub.Create(pb.CreateRequest(items=[
        pb.SessionOptions(env="frozenlake", seed=3)]), timeout=60).results]  # fmt: skip
    steps = stub.Step(pb.StepRequest(items=[
        pb.StepItem(session_id="", step_index=0, response="x"),      # empty id
        pb.StepItem(session_id="s-nope", step_index=0, response="x"),
        pb.StepItem(session_id=made[0], step_index=-1, response="x"),  # negative index
        pb.StepItem(session_id=made[0], step_index=5, response="x"),   # not the next one
        pb.StepItem(session_id=made[0], step_index=0),                # neither input
        pb.StepItem(session_id=made[-1], step_index=0, response="\udc80".encode(
            "utf-8", "surrogatepass").decode("utf-8", "replace") * 10_000),
    ]), timeout=60)  # fmt: skip
    codes = _codes(steps)
    assert codes[:5] == [
        "NOT_FOUND", "NOT_FOUND", "INVALID_ARGUMENT", "FAILED_PRECONDITION", "INVALID_ARGUMENT"
    ]  # fmt: skip
    assert steps.results[2].error.field == "step_index"
    assert codes[5] == "OK"  # garbage text is an invalid action, not an error
    assert '"action_valid": false' in steps.results[5].reply.info_json
    stub.Close(pb.CloseRequest(session_ids=made), timeout=60)


def test_grpc_huge_batches_and_oversized_requests(stub, grpc_server):
    # a batch over the cap: every item answered, the extra ones with CAPACITY
    resp = stub.Create(
        pb.CreateRequest(items=[pb.SessionOptions(env="sokoban", seed=i) for i in range(80)]),
        timeout=120,
    )
    codes = _codes(resp)
    assert len(codes) == 80 and set(codes) <= {"OK", "CAPACITY"} and "CAPACITY" in codes
    made = [r.reply.session_id for r in resp.results if r.HasField("reply")]
    # a batch of unknown ids up to the limit of items per call: one NOT_FOUND each; over
    # it, the whole call is refused at once, naming the limit
    gets = stub.Get(pb.GetRequest(session_ids=[f"s-{i:016x}" for i in range(4096)]), timeout=120)
    assert len(gets.results) == 4096 and {r.error.code for r in gets.results} == {"NOT_FOUND"}
    with pytest.raises(grpc.RpcError) as over:
        stub.Get(pb.GetRequest(session_ids=[f"s-{i:016x}" for i in range(20_000)]), timeout=120)
    assert over.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "limit of 4096 items per call" in over.value.details()
    # the same session twice in one batch
    twice = stub.Step(pb.StepRequest(items=[
        pb.StepItem(session_id=made[0], step_index=0, response="<answer>Up</answer>"),
        pb.StepItem(session_id=made[0], step_index=0, response="<answer>Up</answer>"),
    ]), timeout=60)  # fmt: skip
    assert _codes(twice)[1] == "INVALID_ARGUMENT"
    # a request over the server's message limit is refused by gRPC, and the server goes on
    with pytest.raises(grpc.RpcError) as info:
        stub.Step(pb.StepRequest(items=[
            pb.StepItem(session_id=made[1], step_index=0, response="x" * (64 * 1024 * 1024))
        ]), timeout=60)  # fmt: skip
    assert info.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    # a reply made of many raw frames (an oversized response) still arrives whole
    raw = stub.Get(pb.GetRequest(session_ids=made), timeout=60)
    assert len(raw.results) == len(made)
    stub.Close(pb.CloseRequest(session_ids=made), timeout=120)
    assert grpc_server.alive
    status = stub.Status(pb.StatusRequest(), timeout=30)
    assert '"status": "ok"' in status.status_json
