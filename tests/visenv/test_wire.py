"""visenv.wire: the one table of error codes and the one declaration of the wire types."""

from __future__ import annotations

import io
from pathlib import Path

import grpc
import numpy as np
import pytest
from PIL import Image as PILImage

from visenv import wire

ROOT = Path(__file__).resolve().parents[2]


def test_error_codes_are_the_table_of_docs_wire_md():
    doc = (ROOT / "docs" / "wire.md").read_text()
    table = doc[doc.index("## Errors") :].split("\n\n")[1]
    rows = [line.split("|")[1:4] for line in table.splitlines()[2:]]
    documented = {c.strip(" `"): (int(h), g.strip()) for c, h, g in rows}
    served = {c.name for c in wire.ERROR_CODES.values() if not c.client_only}
    assert set(documented) == served
    for name, (http, grpc_name) in documented.items():
        assert wire.HTTP_STATUS[name] == http
        assert wire.GRPC_STATUS[name] == grpc.StatusCode[grpc_name]


def test_statuses_read_back_as_codes():
    assert wire.code_of_grpc(grpc.StatusCode.INVALID_ARGUMENT) == "INVALID_ARGUMENT"
    # a bare RESOURCE_EXHAUSTED is grpc's own message size limit (CAPACITY carries its code)
    assert wire.code_of_grpc(grpc.StatusCode.RESOURCE_EXHAUSTED) == "PAYLOAD_TOO_LARGE"
    assert wire.code_of_grpc(grpc.StatusCode.PERMISSION_DENIED) == "UNAUTHENTICATED"
    assert wire.code_of_grpc(grpc.StatusCode.DATA_LOSS) == "SESSION_LOST"
    assert wire.code_of_grpc(grpc.StatusCode.CANCELLED) == "INTERNAL"
    assert wire.code_of_http(413) == "PAYLOAD_TOO_LARGE"
    assert wire.code_of_http(403) == "UNAUTHENTICATED"
    assert wire.code_of_http(405) == "INVALID_ARGUMENT"
    assert wire.code_of_http(418) == "INTERNAL"
    for code in wire.ERROR_CODES.values():  # every code's own HTTP status reads back as it
        assert wire.code_of_http(code.http_status) == code.name


def test_every_code_has_a_typed_client_exception():
    from clients.errors import ERRORS_BY_CODE

    assert set(ERRORS_BY_CODE) == set(wire.ERROR_CODES)


def _reply(**kw) -> wire.SessionReply:
    array = np.arange(2 * 3 * 3, dtype=np.uint8).reshape(2, 3, 3)
    png = io.BytesIO()
    PILImage.fromarray(array).save(png, format="PNG")
    fields = dict(
        session_id="s-0123456789abcdef", env="sokoban", step_index=2, episode=1, turn=2,
        observation=wire.Observation(
            "<image> and <image>",
            [wire.Image("raw", array.tobytes(), (2, 3, 3)), wire.Image("png", png.getvalue(), (2, 3, 3))],
            {"player": [1, 2]}, {"room": "a"},
        ),
        reward=1.5, reward_parts=wire.RewardParts(env=1.0, format=0.5),
        terminated=False, truncated=True, success=False,
        info={"action_valid": True, "parse_error": None},
    )  # fmt: skip
    return wire.SessionReply(**{**fields, **kw})


@pytest.mark.parametrize("system_prompt", ["", "RULES"])
def test_session_reply_round_trips_through_json_and_proto(system_prompt):
    reply = _reply(system_prompt=system_prompt)
    assert isinstance(reply.observation.images, tuple)
    assert wire.SessionReply.from_json(reply.to_json()) == reply
    assert wire.SessionReply.from_proto(reply.to_proto()) == reply
    assert ("system_prompt" in reply.to_json()) == bool(system_prompt)
    arrays = [im.to_array() for im in reply.observation.images]
    assert np.array_equal(arrays[0], arrays[1])
    ground_truth = wire.SessionReply.from_proto(reply.to_proto()).observation.ground_truth
    assert isinstance(ground_truth["player"][0], int)


def test_the_sdk_reply_is_the_wire_reply_plus_its_server():
    from clients import SessionReply

    reply = _reply()
    mine = SessionReply.from_proto(reply.to_proto(), server="h:1")
    assert isinstance(mine, wire.SessionReply) and mine.server == "h:1"
    assert mine.to_json() == reply.to_json()  # `server` is not on the wire
    results = wire.batch_from_json(
        {"results": [wire.batch_item_json(reply), wire.batch_item_json(wire.Error("NOT_FOUND", "?"))]},
        SessionReply, server="h:2",
    )  # fmt: skip
    assert results[0].server == "h:2" and results[1] == wire.Error("NOT_FOUND", "?", None)


def test_batch_envelopes_carry_replies_and_errors_on_both_transports():
    reply = _reply()
    error = wire.Error("INTERNAL", "boom", None, "err-1")
    assert wire.batch_from_proto(wire.batch_to_proto([reply, error])) == [reply, error]
    assert wire.fork_from_proto(wire.fork_to_proto([[reply, reply], error])) == [
        [reply, reply],
        error,
    ]
    assert wire.close_from_proto(wire.close_to_proto([None, error])) == [None, error]
    assert wire.close_from_json({"results": [wire.close_item_json(None)]}) == [None]
    forks = {"results": [wire.fork_item_json([reply]), wire.fork_item_json(error)]}
    assert wire.fork_from_json(forks) == [[reply], error]


def test_requests_write_their_json():
    options = wire.SessionOptions("sokoban", {"size": 6}, seed=3, format="no_think")
    assert options.to_json() == {
        "env": "sokoban", "config": {"size": 6}, "seed": 3, "reasoning": {}, "format": "no_think",
    }  # fmt: skip
    assert wire.ActionSpec is wire.Action  # the SDK's name for the one action type
    item = wire.StepItem("s-1", 4, actions=(wire.Action("pick", (1.0, 2.0)),))
    assert item.to_json() == {
        "session_id": "s-1", "step_index": 4, "actions": [{"name": "pick", "args": [1.0, 2.0]}],
    }  # fmt: skip
    # what the server reads from these (their proto form too): tests/api/test_request_parsing.py


def test_openapi_reply_schemas_are_the_wire_types():
    from types import SimpleNamespace

    from env_server.api.rest import build_app
    from env_server.service.metrics import Metrics

    app = build_app(SimpleNamespace(metrics=Metrics(), env_specs={}))  # type: ignore[arg-type]
    schemas = app.openapi()["components"]["schemas"]
    assert set(schemas["SessionReply"]["properties"]) == set(_reply(system_prompt="x").to_json())
    assert set(schemas["Error"]["properties"]) == set(wire.Error("A", "b", None, "c").to_json())
    image = schemas["Image"]["properties"]
    assert image["data"]["contentEncoding"] == "base64"  # standard base64, as to_json writes
    assert image["encoding"]["enum"] == ["png", "jpeg", "raw"]
    assert "step_index" in schemas["SessionReply"]["required"]
    assert "system_prompt" not in schemas["SessionReply"]["required"]
