"""The requests' conversions generated off the proto descriptor (visenv/wire/convert.py):
round trips of every request type, the wire bytes and REST bodies of before, and a walk
over every field of every request message (a field added to the .proto without code
support fails here, and at import)."""

from __future__ import annotations

import dataclasses
import json

import pytest

from visenv import wire
from visenv.v1 import visenv_pb2 as pb
from visenv.wire import convert

A = wire.Action
REQUESTS = (wire.SessionOptions, wire.Action, wire.StepItem, wire.ResetItem, wire.ForkItem)

CASES = [
    wire.SessionOptions("sokoban"),
    wire.SessionOptions(
        "sokoban",
        {"size": 6, "name": "ünï—☃", "nested": {"a": [1, 2.5, None]}},
        seed=3,
        format="no_think",
        representation="symbolic",
        reasoning={"beta_s": 0.5},
        image_encoding="raw",
    ),
    wire.StepItem("s-1", 4, response="<answer>Left, 上</answer>"),
    wire.StepItem("s-1", 0, response=""),
    wire.StepItem(
        "s-1",
        4,
        actions=(A("pick", (1.0, -2.5, 3e300)), A("Left"), A("svg", payload="<svg>é</svg>")),
        image_encoding="jpeg",
    ),
    wire.StepItem("s-1", 2, actions=()),
    wire.ResetItem("s-1"),
    wire.ResetItem("s-1", seed=0),
    wire.ResetItem("s-1", seed=2**63 - 1, image_encoding="png"),
    wire.ForkItem("s-1"),
    wire.ForkItem("s-1", n=5),
]


@pytest.mark.parametrize("obj", CASES, ids=repr)
def test_round_trips(obj):
    msg = wire.to_proto(obj)
    assert isinstance(msg, getattr(pb, type(obj).__name__))
    again = type(msg).FromString(msg.SerializeToString())
    assert wire.from_fields(type(obj), wire.fields_of(again)) == obj
    assert wire.from_fields(type(obj), wire.to_json(obj)) == obj
    # REST's body is plain JSON, and a dict converts as its dataclass does
    assert json.loads(json.dumps(wire.to_json(obj))) == wire.to_json(obj)
    assert wire.to_proto(wire.to_json(obj), type(msg)) == msg


def test_unset_optionals_and_empty_objects_stay_off_the_wire():
    msg = wire.to_proto(wire.SessionOptions("sokoban"))
    assert [f.name for f, _ in msg.ListFields()] == ["env"]
    assert wire.fields_of(msg) == {"env": "sokoban", "config": {}, "seed": 0, "reasoning": {}}
    assert wire.to_json(wire.SessionOptions("sokoban")) == {
        "env": "sokoban",
        "config": {},
        "seed": 0,
        "reasoning": {},
    }
    reset = wire.to_proto(wire.ResetItem("s-1"))
    assert not reset.HasField("seed") and not reset.HasField("image_encoding")
    assert wire.fields_of(reset) == {"session_id": "s-1"}
    zero = wire.to_proto(wire.ResetItem("s-1", seed=0))
    assert zero.HasField("seed") and wire.fields_of(zero) == {"session_id": "s-1", "seed": 0}
    assert wire.fields_of(pb.ForkItem(session_id="s")) == {"session_id": "s"}
    assert wire.to_proto(wire.ForkItem("s")).HasField("n")  # n=1 is sent, as before


def test_the_bytes_are_those_the_hand_written_code_sent():
    options = CASES[1]
    assert wire.to_proto(options) == pb.SessionOptions(
        env="sokoban",
        config_json=json.dumps(options.config),
        seed=3,
        format="no_think",
        representation="symbolic",
        reasoning_json=json.dumps(options.reasoning),
        image_encoding="raw",
    )
    step = CASES[4]
    want = pb.StepItem(session_id="s-1", step_index=4, image_encoding="jpeg")
    want.actions.actions.add(name="pick", args=[1.0, -2.5, 3e300])
    want.actions.actions.add(name="Left")
    want.actions.actions.add(name="svg", payload="<svg>é</svg>")
    assert wire.step_request([step]).items[0].SerializeToString() == want.SerializeToString()
    empty = wire.to_proto(CASES[5])  # actions=(): the (empty) list is still given
    assert empty.WhichOneof("input") == "actions" and wire.fields_of(empty)["actions"] == []


def test_rest_bodies_are_those_of_before():
    assert wire.to_json(CASES[1]) == {
        "env": "sokoban",
        "config": CASES[1].config,
        "seed": 3,
        "reasoning": {"beta_s": 0.5},
        "format": "no_think",
        "representation": "symbolic",
        "image_encoding": "raw",
    }
    assert list(wire.to_json(CASES[1])) == [
        "env", "config", "seed", "reasoning", "format", "representation", "image_encoding"
    ]  # fmt: skip
    assert wire.to_json(CASES[4]) == {
        "session_id": "s-1",
        "step_index": 4,
        "actions": [
            {"name": "pick", "args": [1.0, -2.5, 3e300]},
            {"name": "Left"},
            {"name": "svg", "payload": "<svg>é</svg>"},
        ],
        "image_encoding": "jpeg",
    }
    assert wire.to_json(CASES[5])["actions"] == []
    assert wire.to_json(wire.ResetItem("s-1")) == {"session_id": "s-1"}
    assert wire.to_json(CASES[8]) == {
        "session_id": "s-1",
        "seed": 2**63 - 1,
        "image_encoding": "png",
    }
    assert wire.to_json(wire.ForkItem("s-1")) == {"session_id": "s-1", "n": 1}


def test_a_oneof_sends_one_member():
    neither = wire.StepItem("s-1", 0)  # as before: an empty response
    assert wire.to_proto(neither).WhichOneof("input") == "response"
    assert wire.to_json(neither) == {"session_id": "s-1", "step_index": 0, "response": ""}
    both = wire.StepItem("s-1", 0, response="x", actions=(A("Left"),))  # actions, as before
    assert wire.to_proto(both).WhichOneof("input") == "actions"
    assert "response" not in wire.to_json(both)
    unset = pb.StepItem(session_id="s-1")  # neither on the wire: neither read
    assert wire.fields_of(unset) == {"session_id": "s-1", "step_index": 0}


def test_a_json_field_that_is_not_an_object_names_itself():
    with pytest.raises(wire.InvalidField) as caught:
        wire.fields_of(pb.SessionOptions(env="x", reasoning_json="[1]"))
    assert caught.value.field == "reasoning_json"
    with pytest.raises(wire.InvalidField) as caught:
        wire.fields_of(pb.SessionOptions(env="x", config_json="{"))
    assert caught.value.field == "config_json"


def test_from_fields_reads_a_pydantic_model():
    from env_server.service.models import StepItem

    model = StepItem.model_validate(
        {"session_id": "s", "step_index": 1, "actions": [{"name": "pick", "args": [1.0]}]}
    )
    item = wire.from_fields(wire.StepItem, model)
    assert item == wire.StepItem("s", 1, actions=(A("pick", (1.0,)),))
    assert A.from_json({"name": "Left"}) == A("Left")


def _sample(field: convert.Field, proto_field):
    """A value for `field` that is not its default (so it must reach the wire)."""
    if field.kind == "json":
        return {"k": "v"}
    if field.kind in ("messages", "wrapper"):
        return (A("pick", (1.0,), "p"),)
    if field.kind == "repeated":
        return (1.5, 2.5)
    return {str: "ü", int: 7, float: 0.5, bool: True}[type(proto_field.default_value)]


@pytest.mark.parametrize("cls", REQUESTS, ids=lambda c: c.__name__)
def test_every_field_of_every_request_message_is_converted(cls):
    """Each field of the message, set alone, reaches the wire, is read back by
    `fields_of`, and goes in REST's JSON under its attribute's name."""
    conv = convert.conversions(cls)
    desc = conv.message.DESCRIPTOR
    assert [f.proto for f in conv.fields] == [f.name for f in desc.fields]
    assert {f.attr for f in conv.fields} == {f.name for f in dataclasses.fields(cls)}
    samples = {f.attr: _sample(f, desc.fields_by_name[f.proto]) for f in conv.fields}
    required = {f.name: samples[f.name] for f in dataclasses.fields(cls)
                if f.default is f.default_factory is dataclasses.MISSING}  # fmt: skip
    for field in conv.fields:
        obj = cls(**{**required, field.attr: samples[field.attr]})
        msg = wire.to_proto(obj)
        assert field.proto in {f.name for f, _ in msg.ListFields()}, field
        read = wire.fields_of(type(msg).FromString(msg.SerializeToString()))
        assert read[field.attr] == wire.to_json(obj)[field.attr], field  # as REST's
        assert wire.to_proto(wire.from_fields(cls, read)) == msg, field


def test_a_field_without_its_counterpart_fails_at_declaration():
    @dataclasses.dataclass(frozen=True)
    class Fork:  # no `n`
        session_id: str

    with pytest.raises(TypeError, match=r"proto fields without an attribute \['n'\]"):
        convert.declared(pb.ForkItem)(Fork)

    @dataclasses.dataclass(frozen=True)
    class Extra:
        session_id: str
        n: int = 1
        colour: str = ""

    with pytest.raises(TypeError, match=r"attributes without a proto field \['colour'\]"):
        convert.declared(pb.ForkItem)(Extra)
    assert convert.conversions(wire.ForkItem).cls is wire.ForkItem  # still the SDK's
