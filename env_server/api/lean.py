"""The REST step's lean route: `POST /v1/sessions/{id}/step` answered without FastAPI's
routing, dependency solving and per-route exception wrappers.

The single-session step is the call a per-session client (one agent loop per episode)
makes most, and FastAPI's machinery around its endpoint cost about a third of the API
process's CPU on it (py-spy, docs/experiments/2026-12-06-one-data-path.md). This pure ASGI
middleware sits inside the app's own middlewares, so the token, the body-size limit, the
wait for the service's start and the INTERNAL error for a bug are all theirs, unchanged.

It answers only what it can answer exactly as the FastAPI route would: a body that
parses and validates into the route's own `StepBody`. Anything else (malformed or
invalid JSON, a body large enough to be parsed off the event loop, a chunked body) is
handed, bytes unchanged, to the FastAPI route, whose error is the documented one. The route
stays registered, so /docs and the OpenAPI schema still describe it.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from typing import Any

import pydantic
from fastapi.responses import Response
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from env_server.service.models import ServiceError, StepBody
from env_server.service.protocol import SessionService

STEP_PATH = re.compile(r"/v1/sessions/([^/]+)/step")


class LeanStepMiddleware:
    """`POST /v1/sessions/{id}/step` straight to `service.step`; `answer` turns its result
    (a reply or a ServiceError) into the route's response; `max_bytes`: bodies larger than
    this go to the FastAPI route (which parses them in a thread)."""

    def __init__(
        self,
        app: ASGIApp,
        service: SessionService,
        answer: Callable[[Any], Response],
        max_bytes: int,
    ) -> None:
        self.app, self.service, self.answer, self.max_bytes = app, service, answer, max_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        match = STEP_PATH.fullmatch(scope["path"]) if scope["type"] == "http" else None
        if match is None or scope["method"] != "POST":
            return await self.app(scope, receive, send)
        message = await receive()  # the whole body: TokenSizeMiddleware read and replays it
        body = self._body(message, match[1])
        if body is None:
            return await self.app(scope, _replay(message, receive), send)
        try:
            result = (await self.service.step([body.item(match[1])]))[0]
        except ServiceError as error:  # a whole call refused (as the app's handler answers)
            result = error
        await self.answer(result)(scope, receive, send)

    def _body(self, message: Message, session_id: str) -> StepBody | None:
        """The validated body, or None where the FastAPI route must answer."""
        data = message.get("body", b"")
        if message["type"] != "http.request" or message.get("more_body") or (
            len(data) > self.max_bytes
        ):  # fmt: skip
            return None
        try:
            return StepBody.model_validate(json.loads(data))
        # a JSON or Unicode error (ValueError), nesting too deep for json.loads, invalid
        except (ValueError, RecursionError, pydantic.ValidationError):
            return None


def _replay(message: Message, receive: Receive) -> Receive:
    """`receive` with `message` given back first."""
    sent = False

    async def replay() -> Message:
        nonlocal sent
        if not sent:
            sent = True
            return message
        return await receive()

    return replay
