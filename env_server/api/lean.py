"""The REST steps' lean route: `POST /v1/sessions/{id}/step` and `POST /v1/batch/step`
answered without FastAPI's routing, dependency solving and per-route exception wrappers.

A step is the call a client makes most (the SDK's HTTP transport steps even one session
through the batch route). FastAPI's machinery around the single-session endpoint cost
about a third of the API process's CPU on it (py-spy; docs/experiments/
2026-12-06-one-data-path.md). This pure ASGI middleware sits inside the app's own
middlewares, so the token, the body-size limit, the wait for the service's start and the
INTERNAL error for a bug are all theirs, unchanged.

It answers only what it can answer exactly as the FastAPI route would: a body that parses
and validates into the route's own model (`StepBody`, `BatchStep`; a batch's items are
validated one by one by the service, as behind the route). Anything else (malformed or
invalid JSON, a body large enough to be parsed off the event loop, a chunked body) is
handed, bytes unchanged, to the FastAPI route, whose error is the documented one. The
routes stay registered, so /docs and the OpenAPI schema still describe them.
"""

from __future__ import annotations

import json
import re
from collections.abc import Awaitable, Callable
from typing import Any

import pydantic
from fastapi.responses import Response
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from env_server.service.models import BatchStep, ServiceError, StepBody
from env_server.service.protocol import SessionService

from .connections import replayed

STEP_PATH = re.compile(r"/v1/sessions/([^/]+)/step")
BATCH_PATH = "/v1/batch/step"


class LeanStepMiddleware:
    """The two step routes straight to `service.step`; `one` and `batch` turn its results
    into the routes' responses; `max_bytes`: bodies larger than this go to the FastAPI
    routes (which parse them in a thread)."""

    def __init__(
        self,
        app: ASGIApp,
        service: SessionService,
        one: Callable[[Any], Response],
        batch: Callable[[list], Awaitable[Response]],
        max_bytes: int,
    ) -> None:
        self.app, self.service, self.max_bytes = app, service, max_bytes
        self.one, self.batch = one, batch

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["method"] != "POST":
            return await self.app(scope, receive, send)
        single = STEP_PATH.fullmatch(scope["path"])
        if single is None and scope["path"] != BATCH_PATH:
            return await self.app(scope, receive, send)
        message = await receive()  # the whole body: TokenSizeMiddleware read and replays it
        body = self._body(message, StepBody if single else BatchStep)
        if body is None:
            return await self.app(scope, replayed(message, receive), send)
        items = [body.item(single[1])] if single else body.items
        try:
            results = await self.service.step(items)
        except ServiceError as error:  # a whole call refused (as the app's handler answers)
            response = self.one(error)
        else:
            response = self.one(results[0]) if single else await self.batch(results)
        await response(scope, receive, send)

    def _body(self, message: Message, model: type[pydantic.BaseModel]) -> Any:
        """The validated body, or None where the FastAPI route must answer."""
        data = message.get("body", b"")
        if message["type"] != "http.request" or message.get("more_body") or (
            len(data) > self.max_bytes
        ):  # fmt: skip
            return None
        try:
            return model.model_validate(json.loads(data))
        # a JSON or Unicode error (ValueError), nesting too deep for json.loads, invalid
        except (ValueError, RecursionError, pydantic.ValidationError):
            return None
