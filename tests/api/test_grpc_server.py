"""The visenv.v1 gRPC service of a real `visenv serve` process, spoken to with the raw
generated stub (no client SDK): per-item errors, JSON fields, health, reflection,
message size limits."""

from __future__ import annotations

import json

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc

from visenv.v1 import visenv_pb2 as pb
from visenv.v1 import visenv_pb2_grpc as pb_grpc

OPTIONS = [("grpc.max_receive_message_length", 256 * 1024 * 1024)]


@pytest.fixture(scope="module")
def channel(visenv_server):
    with grpc.insecure_channel(visenv_server.grpc, options=OPTIONS) as ch:
        yield ch


@pytest.fixture(scope="module")
def stub(channel):
    return pb_grpc.VisenvStub(channel)


def _create(stub, n=1, **kw) -> list[pb.SessionReply]:
    req = pb.CreateRequest(items=[pb.SessionOptions(env="sokoban", seed=i, **kw) for i in range(n)])
    resp = stub.Create(req, timeout=60)
    assert all(r.HasField("reply") for r in resp.results), resp.results
    return [r.reply for r in resp.results]


def _close(stub, replies):
    stub.Close(pb.CloseRequest(session_ids=[r.session_id for r in replies]), timeout=30)


def test_list_envs_and_status(stub):
    envs = {e.name: e for e in stub.ListEnvs(pb.ListEnvsRequest(), timeout=30).envs}
    assert envs["sokoban"].available and envs["sokoban"].enabled
    assert "properties" in json.loads(envs["sokoban"].config_schema_json)
    assert json.loads(envs["sokoban"].action_space_json)["names"] == ["Up", "Down", "Left", "Right"]
    status = json.loads(stub.Status(pb.StatusRequest(), timeout=30).status_json)
    assert status["status"] == "ok" and "sessions" in status


def test_create_reply_carries_observation_and_json_fields(stub):
    (reply,) = _create(stub, format="no_think", image_encoding="raw")
    try:
        assert reply.session_id.startswith("s-") and reply.step_index == 0
        assert reply.observation.text.count("<image>") == len(reply.observation.images) == 1
        image = reply.observation.images[0]
        assert image.encoding == "raw" and list(image.shape) == [96, 96, 3]
        assert len(image.data) == 96 * 96 * 3
        truth = json.loads(reply.observation.ground_truth_json)
        assert isinstance(truth["player"][0], int)  # JSON text keeps ints ints
        assert reply.system_prompt and reply.reward == 0.0
    finally:
        _close(stub, [reply])


def test_one_bad_item_does_not_fail_the_batch(stub):
    good = _create(stub, n=2, format="no_think")
    try:
        resp = stub.Create(
            pb.CreateRequest(
                items=[
                    pb.SessionOptions(env="sokoban", config_json="{not json"),
                    pb.SessionOptions(env="sokoban", config_json='{"num_boxes": 99}'),
                    pb.SessionOptions(env="sokoban", format="no-such-format"),
                    pb.SessionOptions(env="sokoban", seed=5),
                ]
            ),
            timeout=60,
        )
        bad_json, bad_config, bad_format, ok = resp.results
        assert bad_json.error.code == "INVALID_ARGUMENT" and bad_json.error.field == "config_json"
        assert bad_config.error.code == "INVALID_ARGUMENT" and "num_boxes" in bad_config.error.field
        assert bad_format.error.code == "INVALID_ARGUMENT" and bad_format.error.field == "format"
        good.append(ok.reply)

        step = pb.StepRequest()
        step.items.add(session_id=good[0].session_id, step_index=0, response="<answer>Up</answer>")
        step.items.add(
            session_id="s-0000000000000000", step_index=0, response="<answer>Up</answer>"
        )
        step.items.add(session_id=good[1].session_id, step_index=5, response="<answer>Up</answer>")
        step.items.add(session_id=good[2].session_id, step_index=0)  # neither response nor actions
        moved = step.items.add(session_id=good[1].session_id, step_index=0)
        moved.actions.actions.add(name="Left")
        results = stub.Step(step, timeout=60).results
        assert results[0].reply.step_index == 1
        assert results[1].error.code == "NOT_FOUND"
        assert results[2].error.code in ("FAILED_PRECONDITION", "INVALID_ARGUMENT")
        assert results[3].error.code == "INVALID_ARGUMENT" and results[3].error.field == "input"
        assert results[0].reply.info_json and "action_valid" in json.loads(
            results[0].reply.info_json
        )
    finally:
        _close(stub, good)


def test_explicit_actions_skip_format_reward(stub):
    (reply,) = _create(stub)
    try:
        step = pb.StepRequest()
        item = step.items.add(session_id=reply.session_id, step_index=0)
        item.actions.actions.add(name="Left")
        (result,) = stub.Step(step, timeout=60).results
        assert result.reply.reward_parts.format == 0.0
        assert json.loads(result.reply.info_json)["actions_executed"] <= 1
        got = stub.Get(pb.GetRequest(session_ids=[reply.session_id]), timeout=30).results[0]
        assert got.reply == result.reply
    finally:
        _close(stub, [reply])


def test_large_image_batch_fits_the_message_limits(stub):
    # 12 raw 384x384 frames: ~5.3 MB, over gRPC's default 4 MB message limit
    replies = _create(stub, n=12, image_encoding="raw", config_json='{"tile_size": 64}')
    try:
        assert sum(len(r.observation.images[0].data) for r in replies) > 4 * 1024 * 1024
    finally:
        _close(stub, replies)
    results = stub.Close(pb.CloseRequest(session_ids=[replies[0].session_id]), timeout=30).results
    assert not results[0].ok and results[0].error.code == "NOT_FOUND"


def test_client_sdk_accepts_large_image_batches(visenv_server):
    # submodules: under pytest, tests/clients can shadow the top-level `clients` package
    from clients import EnvClient
    from clients.types import SessionOptions

    options = SessionOptions("sokoban", config={"tile_size": 64}, image_encoding="raw")
    with EnvClient(visenv_server.grpc) as client:
        replies = client.create([options] * 12)
        assert sum(len(r.observation.images[0].data) for r in replies) > 4 * 1024 * 1024


def test_health_and_reflection(channel):
    health = health_pb2_grpc.HealthStub(channel)
    resp = health.Check(health_pb2.HealthCheckRequest(service=""), timeout=10)
    assert resp.status == health_pb2.HealthCheckResponse.SERVING
    refl = reflection_pb2_grpc.ServerReflectionStub(channel)
    (answer,) = list(
        refl.ServerReflectionInfo(
            iter([reflection_pb2.ServerReflectionRequest(list_services="")]), timeout=10
        )
    )
    names = {s.name for s in answer.list_services_response.service}
    assert {"visenv.v1.Visenv", "grpc.health.v1.Health"} <= names
