"""A request is parsed once, at the adapter, into the service's model: the gRPC servicer
reads a client's proto items into the same models REST validates its JSON into, with the
same errors naming the same fields (no server: the adapters' parsing functions)."""

from __future__ import annotations

import math

import pytest

from env_server.api import grpc_server
from env_server.core.types import Action
from env_server.service.models import ServiceError, SessionOptions, StepBody, StepItem
from visenv import wire
from visenv.v1 import visenv_pb2 as pb


def _rest(model, data):
    """What the service makes of a REST item (batch items are validated there)."""
    from pydantic import ValidationError

    try:
        return model.model_validate(data)
    except ValidationError as exc:
        return ServiceError.from_validation(exc)


def _grpc(parse, msg):
    try:
        return parse(msg)
    except ServiceError as error:
        return error


OPTIONS = [
    wire.SessionOptions("sokoban"),
    wire.SessionOptions(
        "sokoban",
        {"size": 6},
        seed=3,
        format="no_think",
        image_encoding="raw",
        representation="symbolic",
        reasoning={"beta_s": 0.5},
    ),  # fmt: skip
    wire.SessionOptions("sokoban", format="no-such-format"),
    wire.SessionOptions("sokoban", seed=-5),
    wire.SessionOptions("sokoban", {"x": math.inf}),
]
STEPS = [
    wire.StepItem("s-1", 4, response="<answer>Left</answer>"),
    wire.StepItem(
        "s-1",
        4,
        actions=(Action("pick", (1.0, 2.0, 3.0)), Action("svg", payload="<svg/>")),
        image_encoding="raw",
    ),  # fmt: skip
    wire.StepItem("s-1", 0, actions=(Action("pick", (1.0, math.nan)),)),
    wire.StepItem("s-1", -1, response="x"),
]


@pytest.mark.parametrize("options", OPTIONS)
def test_create_items_parse_alike_from_json_and_proto(options):
    from_json = _rest(SessionOptions, options.to_json())
    from_proto = _grpc(grpc_server.options_item, options.to_proto())
    assert from_proto == from_json


@pytest.mark.parametrize("item", STEPS)
def test_step_items_parse_alike_from_json_and_proto(item):
    from_json = _rest(StepItem, item.to_json())
    from_proto = _grpc(grpc_server.step_item, wire.step_request([item]).items[0])
    assert from_proto == from_json


def test_the_errors_name_the_fields():
    nan = _grpc(grpc_server.step_item, wire.step_request([STEPS[2]]).items[0])
    assert (nan.code, nan.field) == ("INVALID_ARGUMENT", "actions.0.args.1")
    seed = _grpc(grpc_server.options_item, OPTIONS[3].to_proto())
    assert seed.field == "seed"
    index = _grpc(grpc_server.step_item, wire.step_request([STEPS[3]]).items[0])
    assert index.field == "step_index"
    neither = _grpc(grpc_server.step_item, pb.StepItem(session_id="s-1"))
    assert (neither.field, neither.message) == (
        "input",
        "give exactly one of 'response' or 'actions'",
    )
    bad_json = _grpc(grpc_server.options_item, pb.SessionOptions(env="sokoban", config_json="[1]"))
    assert bad_json.field == "config_json"
    reset = _grpc(grpc_server.reset_item, pb.ResetItem(session_id="s-1", seed=-1))
    assert reset.field == "seed"
    fork = _grpc(grpc_server.fork_item, pb.ForkItem(session_id="s-1", n=0))
    assert fork.field == "n"


def test_a_rest_body_becomes_its_item_without_a_second_validation():
    body = StepBody.model_validate({"step_index": 2, "actions": [{"name": "Left"}]})
    item = body.item("s-1")
    assert item == StepItem.model_validate({"session_id": "s-1", **body.model_dump()})
    assert item.actions[0] is body.actions[0]  # the same ActionModel travels on
