"""The frame endpoint's source: the latest image a session showed (worker level)."""

from __future__ import annotations

import io

import numpy as np
from PIL import Image

from env_server.core import registry
from env_server.service.messages import Create, Frame, Step
from env_server.service.models import ServiceError
from env_server.service.worker import Worker


def _png(data: bytes) -> np.ndarray:
    return np.asarray(Image.open(io.BytesIO(data)).convert("RGB"))


def test_frame_keeps_the_image_after_a_text_only_feedback_turn():
    worker = Worker()
    options = {"env": "vicrit", "seed": 3, "config": {"feedback": "unary", "max_attempts": 3}}
    [made] = worker.handle([Create("s-1", options)])
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
    worker.handle([Create("s-2", {"env": "frozenlake", "config": {"render_mode": "text"}})])
    [error] = worker.handle([Frame("s-2")])
    assert isinstance(error, ServiceError) and error.code == "NOT_FOUND"
    assert "shown no image" in error.message
