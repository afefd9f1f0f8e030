"""The replies' conversions generated off the proto descriptor (`SessionReply`,
`Observation`, `Image`, `RewardParts`, declared with `convert.declared(..., reply=True)`):
the bytes and JSON the hand-written code made, round trips (the SDK's subclass too), the
JSON fields kept as text until read, and a walk over every field of every reply message."""

from __future__ import annotations

import base64
import json

import pytest

from clients.types import SessionReply as SDKReply
from visenv import wire
from visenv.v1 import visenv_pb2 as pb
from visenv.wire import convert

REPLIES = (wire.Image, wire.Observation, wire.RewardParts, wire.SessionReply)
PNG = b"\x89PNG\r\n\x1a\n\x00\xff"


def reply(system_prompt: str = "", images: tuple = (wire.Image("png", PNG, (2, 1, 3)),)):
    return wire.SessionReply(
        session_id="s-1",
        env="sokoban",
        step_index=3,
        episode=1,
        turn=3,
        observation=wire.Observation(
            "<image> ünï—☃", images, {"player": [1, 2], "nested": {"a": [None, 2.5]}}, {"t": 1}
        ),
        reward=-0.25,
        reward_parts=wire.RewardParts(env=-0.1, format=0.5, observation=0.1, penalty=-0.75),
        terminated=False,
        truncated=True,
        success=False,
        info={"action_valid": True, "actions": ["Left"]},
        system_prompt=system_prompt,
    )


def hand_written(r: wire.SessionReply) -> pb.SessionReply:
    """The message the hand-written fill_proto wrote (before the declaration)."""
    obs = r.observation
    out = pb.SessionReply(
        session_id=r.session_id,
        env=r.env,
        step_index=r.step_index,
        episode=r.episode,
        turn=r.turn,
        reward=r.reward,
        terminated=r.terminated,
        truncated=r.truncated,
        success=r.success,
        info_json=json.dumps(r.info),
    )
    if r.system_prompt:
        out.system_prompt = r.system_prompt
    out.observation.text = obs.text
    for im in obs.images:
        out.observation.images.add(encoding=im.encoding, data=im.data, shape=im.shape)
    out.observation.ground_truth_json = json.dumps(obs.ground_truth)
    out.observation.info_json = json.dumps(obs.info)
    p = r.reward_parts
    out.reward_parts.env, out.reward_parts.format = p.env, p.format
    out.reward_parts.observation, out.reward_parts.prediction = p.observation, p.prediction
    out.reward_parts.penalty = p.penalty
    return out


@pytest.mark.parametrize("prompt", ["", "You are playing Sokoban."])
def test_the_bytes_and_json_are_those_the_hand_written_code_made(prompt):
    r = reply(prompt)
    assert r.to_proto().SerializeToString() == hand_written(r).SerializeToString()
    body = r.to_json()
    assert list(body) == [
        "session_id", "env", "step_index", "episode", "turn", "observation", "reward",
        "reward_parts", "terminated", "truncated", "success", "info",
    ] + (["system_prompt"] if prompt else [])  # fmt: skip
    assert body["observation"] == {
        "text": "<image> ünï—☃",
        "images": [{"encoding": "png", "data": base64.b64encode(PNG).decode(), "shape": [2, 1, 3]}],
        "ground_truth": {"player": [1, 2], "nested": {"a": [None, 2.5]}},
        "info": {"t": 1},
    }
    assert body["reward_parts"] == {
        "env": -0.1, "format": 0.5, "observation": 0.1, "prediction": 0.0, "penalty": -0.75
    }  # fmt: skip
    assert r.to_proto().HasField("system_prompt") is bool(prompt)


def test_a_text_only_observation_keeps_its_empty_image_list_in_json():
    r = reply(images=())
    assert r.to_json()["observation"]["images"] == []
    assert wire.SessionReply.from_json(r.to_json()).observation.images == ()


@pytest.mark.parametrize("prompt", ["", "system"])
def test_round_trips_and_the_sdk_subclass(prompt):
    r = reply(prompt)
    msg = pb.SessionReply.FromString(r.to_proto().SerializeToString())
    for back in (
        wire.SessionReply.from_proto(msg),
        wire.SessionReply.from_json(json.loads(json.dumps(r.to_json()))),
    ):
        assert back.to_json() == r.to_json()
        assert back.to_proto() == r.to_proto()
    sdk = SDKReply.from_proto(msg, server="host:1")
    assert type(sdk) is SDKReply and sdk.server == "host:1" and sdk.to_json() == r.to_json()
    sdk = SDKReply.from_json(r.to_json(), server="host:2")
    assert sdk.server == "host:2" and sdk.system_prompt == prompt


def test_the_json_fields_stay_text_until_read():
    msg = reply().to_proto()
    back = wire.SessionReply.from_proto(msg)
    assert back.json_text("info") == msg.info_json
    assert back.observation.json_text("ground_truth") == msg.observation.ground_truth_json
    assert back.observation.ground_truth["player"] == [1, 2]  # decoded when read
    assert back.observation.json_text("ground_truth") is None


def test_json_numbers_are_cast_to_the_field_types_and_missing_keys_take_defaults():
    back = wire.SessionReply.from_json({"session_id": "s", "reward": 10, "step_index": 2.0,
                                        "observation": {"text": "t"}})  # fmt: skip
    assert type(back.reward) is float and back.reward == 10.0 and back.step_index == 2
    assert back.reward_parts == wire.RewardParts() and back.info == {}
    assert back.observation.images == () and back.system_prompt == ""
    assert not back.terminated and back.env == ""


def _sample(proto_field):
    if proto_field.message_type is not None:
        return None  # nested: covered through the nested type
    if proto_field.is_repeated:
        return (2, 1, 3)
    return {str: "ü", int: 7, float: 0.5, bool: True, bytes: b"\x00\xff"}[
        type(proto_field.default_value)
    ]


@pytest.mark.parametrize("cls", REPLIES, ids=lambda c: c.__name__)
def test_every_field_of_every_reply_message_is_converted(cls):
    """Each field of the message reaches the wire and comes back, by both forms."""
    conv = convert.conversions(cls)
    desc = conv.message.DESCRIPTOR
    assert [f.proto for f in conv.fields] == [f.name for f in desc.fields]
    template = {
        wire.Image: lambda: wire.Image("png", PNG, (1, 1, 3)),
        wire.Observation: lambda: reply().observation,
        wire.RewardParts: lambda: wire.RewardParts(),
        wire.SessionReply: lambda: reply("prompt"),
    }[cls]()
    for field in conv.fields:
        value = _sample(desc.fields_by_name[field.proto])
        if value is None or field.kind == "json":
            obj = template
        else:
            obj = template
            object.__setattr__(obj, field.attr, value)
        msg = obj.to_proto()
        assert field.proto in {f.name for f, _ in msg.ListFields()}, field
        assert cls.from_proto(msg).to_proto() == msg, field
        assert cls.from_json(json.loads(json.dumps(obj.to_json()))).to_proto() == msg, field
