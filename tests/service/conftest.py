"""Fixtures shared by the service tests."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Coroutine, Iterator
from typing import Any

import grpc
import pytest

from visenv.v1 import visenv_pb2_grpc as pb_grpc


@pytest.fixture(scope="module")
def run() -> Iterator[Callable[[Coroutine[Any, Any, Any]], Any]]:
    """`run(coro)`: runs a coroutine on one event loop that lives as long as the test
    module (and so as long as a module-scoped service started on it)."""
    loop = asyncio.new_event_loop()
    yield loop.run_until_complete
    loop.close()


@pytest.fixture(scope="module")
def stub(server):
    """A gRPC stub on the `server` fixture of the test module."""
    with grpc.insecure_channel(server.grpc) as channel:
        yield pb_grpc.VisenvStub(channel)
