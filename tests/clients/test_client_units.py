"""Pieces of the client SDK that need no server."""

from __future__ import annotations

import asyncio
import io
import pickle

import numpy as np
import pytest
from PIL import Image as PILImage

from clients import (
    CapacityError,
    Image,
    Observation,
    PolicyInput,
    SessionLost,
    SessionOptions,
    VisenvError,
)
from clients.errors import error_from_code
from clients.transport import GrpcTransport, HttpTransport, SplittingTransport, make_transport
from clients.types import SessionReply
from visenv.v1 import visenv_pb2 as pb


def test_error_codes_map_to_typed_exceptions_and_survive_pickling():
    err = error_from_code("SESSION_LOST", "worker died", "session_id")
    assert isinstance(err, SessionLost) and isinstance(err, VisenvError)
    assert (err.code, err.message, err.field) == ("SESSION_LOST", "worker died", "session_id")
    again = pickle.loads(pickle.dumps(err))
    assert type(again) is SessionLost and again.field == "session_id"
    assert isinstance(error_from_code("CAPACITY", "full"), CapacityError)
    odd = error_from_code("SOMETHING_NEW", "?")
    assert type(odd) is VisenvError and odd.code == "SOMETHING_NEW"


def test_images_decode_from_png_and_raw():
    rng = np.random.default_rng(0)
    array = rng.integers(0, 256, size=(5, 7, 3), dtype=np.uint8)
    buf = io.BytesIO()
    PILImage.fromarray(array).save(buf, format="PNG")
    assert np.array_equal(Image("png", buf.getvalue(), (5, 7, 3)).to_array(), array)
    assert np.array_equal(Image("raw", array.tobytes(), (5, 7, 3)).to_array(), array)


def test_transport_is_picked_by_scheme():
    async def make_all() -> list:
        made = [
            make_transport("http://h:1", "grpc", None, 1.0),
            make_transport("h:1", "http", None, 1.0),
            make_transport("grpc://h:1", "http", None, 1.0),
        ]
        for t in made:
            await t.aclose()
        return made

    made = asyncio.run(make_all())  # grpc.aio channels need a loop
    assert all(isinstance(t, SplittingTransport) for t in made)  # split by the server's limits
    assert [type(t.inner) for t in made] == [HttpTransport, HttpTransport, GrpcTransport]
    with pytest.raises(ValueError, match="scheme"):
        make_transport("ftp://h:1", "grpc", None, 1.0)


def test_session_options_leave_unset_fields_to_the_server():
    body = SessionOptions("sokoban", seed=3).to_json()
    assert body == {"env": "sokoban", "config": {}, "seed": 3, "reasoning": {}}


def test_reply_from_proto_keeps_json_types():
    msg = pb.SessionReply(session_id="s-1", env="sokoban", step_index=2, reward=1.5)
    msg.observation.text = "<image>"
    msg.observation.images.add(encoding="raw", data=b"\0" * 12, shape=[2, 2, 3])
    msg.observation.ground_truth_json = '{"player": [1, 2]}'
    msg.info_json = '{"action_valid": true}'
    reply = SessionReply.from_proto(msg, server="h:1")
    assert reply.observation.ground_truth == {"player": [1, 2]}
    assert isinstance(reply.observation.ground_truth["player"][0], int)
    assert reply.info["action_valid"] is True and reply.server == "h:1" and not reply.done


def test_policy_input_messages_interleave_text_and_images():
    im = Image("raw", b"\0" * 12, (2, 2, 3))
    obs = Observation("Look: <image> then act.", (im,), {}, {})
    p = PolicyInput(episode=0, seed=0, turn=0, system_prompt="RULES", observation=obs, history=[])
    assert p.prompt == "RULES\n\nLook: <image> then act."
    (system, user) = p.messages()
    assert system == {"role": "system", "content": "RULES"}
    assert [part["type"] for part in user["content"]] == ["text", "image", "text"]
    assert user["content"][1]["image"] is im
