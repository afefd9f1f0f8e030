"""The frame endpoint's source: the latest image a session showed (worker level)."""

from __future__ import annotations

import io

import numpy as np
from PIL import Image

from clients import SessionOptions
from env_server.core import registry
from env_server.reasoning import ReasoningConfig
from env_server.service.messages import Create, Frame, Step
from env_server.service.models import ServiceError
from env_server.service.models import SessionOptions as Options
from env_server.service.worker import Worker


def _png(data: bytes) -> np.ndarray:
    return np.asarray(Image.open(io.BytesIO(data)).convert("RGB"))


def test_frame_keeps_the_image_after_a_text_only_feedback_turn():
    worker = Worker()
    options = Options(env="vicrit", seed=3, config={"feedback": "unary", "max_attempts": 3})
    [made] = worker.handle([Create("s-1", options, ReasoningConfig())])
    assert made.observation.images  # the scene to caption
    [stepped] = worker.handle([Step("s-1", "<answer>no error</answer>")])
    reply = stepped.reply
    assert not (reply.terminated or reply.truncated)
    assert not reply.observation.images  # text feedback only
    [frame] = worker.handle([Frame("s-1")])
    local = registry.make("vicrit", {"feedback": "unary", "max_attempts": 3})
    np.testing.assert_array_equal(_png(frame), local.reset(3).images[0])


def test_frame_of_a_text_only_session_names_why():
    worker = Worker()
    options = Options(env="frozenlake", config={"render_mode": "text"})
    worker.handle([Create("s-2", options, ReasoningConfig())])
    [error] = worker.handle([Frame("s-2")])
    assert isinstance(error, ServiceError) and error.code == "NOT_FOUND"
    assert "shown no image" in error.message


def test_frame_over_rest_grpc_and_through_a_gateway(start_visenv_server):
    """The latest image, after a text-only turn, from the server itself (REST, gRPC's Frame,
    the SDK on both) and through a gateway in front of it (REST and gRPC): one picture."""
    from clients import EnvClient, NotFound

    server = start_visenv_server(workers=1, envs="vicrit,frozenlake")
    gateway = start_visenv_server(envs=None, upstreams=[server.grpc])
    with EnvClient(gateway.grpc) as client:
        config = {"feedback": "unary", "max_attempts": 3}
        [made] = client.create([SessionOptions("vicrit", config=config, seed=3)])
        [stepped] = client.step([made.session_id], ["<answer>no error</answer>"])
        assert not stepped.observation.images and not stepped.done  # text feedback only
        sid = made.session_id
        pictures = [client.frame(sid)[0]]
        for address, transport in ((server.http, "http"), (server.grpc, "grpc"),
                                   (gateway.http, "http")):  # fmt: skip
            other = EnvClient(address, transport=transport)
            other.attach(sid, address)
            pictures.append(other.frame(sid)[0])
            other.close_client(close_sessions=False)
        with server.client() as http:
            pictures.append(http.get(f"/v1/sessions/{sid}/frame.png").content)
        first = made.observation.images[0].to_array()
        for png in pictures:
            np.testing.assert_array_equal(_png(png), first)

        [text] = client.create([SessionOptions("frozenlake", config={"render_mode": "text"})])
        [error] = client.frame(text.session_id, return_exceptions=True)
        assert isinstance(error, NotFound) and "shown no image" in str(error)
        # ...and the gateway still knows the session (a frame's NOT_FOUND is not a lost one)
        assert client.get(text.session_id)[0].session_id == text.session_id
