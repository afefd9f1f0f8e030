"""Connection limits of the HTTP server, and a log that no flood can fill.

uvicorn closes a keep-alive connection idle for `timeout_keep_alive` s, but holds a
connection that sends its headers or its body slowly (slow-loris), or never sends
anything, for as long as the client likes, and accepts connections until the process runs
out of descriptors ("Too many open files": then nobody gets in). `limited_http` adds what
is missing to uvicorn's own protocol:

- a header timeout: a request's headers must all arrive within `header_timeout` s of its
  first byte (of the connection, for its first request); else 408 and the connection
  closes;
- a body timeout: its body within `body_timeout` s of its headers; else 408, closed;
- a connection cap: a connection beyond `max_connections` open ones is answered 503
  UNAVAILABLE (`Retry-After: 1`) and closed at once, so the descriptors never run out.

`RateLimitedLog` is a logging filter: at most `burst` records of one kind (logger and
message template) per `interval` s; the next one let through says how many it dropped.
"""

from __future__ import annotations

import asyncio
import json
import logging
import resource
import time
from dataclasses import dataclass

from starlette.types import Message, Receive
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

log = logging.getLogger("visenv.connections")
RESERVED_DESCRIPTORS = 256  # kept for workers' pipes, log files, upstream channels


def descriptor_limit() -> int:
    """Raise this process's soft limit on open descriptors to its hard limit; the limit."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != resource.RLIM_INFINITY and soft < hard:
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
        soft = hard
    return soft


def default_max_connections() -> int:
    """Per transport (HTTP, gRPC): half of the descriptors left after a reserve."""
    return max(16, (descriptor_limit() - RESERVED_DESCRIPTORS) // 2)


@dataclass(frozen=True)
class ConnectionLimits:
    header_timeout: float
    body_timeout: float
    max_connections: int


def _error_response(status: bytes, code: str, message: str, field: str | None) -> bytes:
    body = json.dumps({"error": {"code": code, "message": message, "field": field}}).encode()
    head = (
        b"HTTP/1.1 " + status + b"\r\ncontent-type: application/json\r\n"
        b"content-length: " + str(len(body)).encode() + b"\r\nconnection: close\r\n"
    )
    if code == "UNAVAILABLE":
        head += b"retry-after: 1\r\n"
    return head + b"\r\n" + body


def limited_http(limits: ConnectionLimits) -> type[HttpToolsProtocol]:
    """uvicorn's httptools protocol with `limits` (the module docstring)."""

    class LimitedHttp(HttpToolsProtocol):
        refused = 0  # connections refused at the cap (`/metrics` could read it)

        def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
            self._deadline: asyncio.TimerHandle | None = None
            super().connection_made(transport)
            if len(self.connections) > limits.max_connections:
                type(self).refused += 1
                log.warning(
                    "refused a connection: %d open, the most is %d (VISENV_MAX_CONNECTIONS)",
                    len(self.connections) - 1, limits.max_connections,
                )  # fmt: skip
                message = "the server holds its most connections; retry"
                transport.write(_error_response(b"503 Service Unavailable", "UNAVAILABLE", message, None))  # fmt: skip
                transport.close()
                return
            self._arm(limits.header_timeout, "headers")

        def _arm(self, seconds: float, part: str) -> None:
            self._disarm()
            self._deadline = self.loop.call_later(seconds, self._too_slow, seconds, part)

        def _disarm(self) -> None:
            if self._deadline is not None:
                self._deadline.cancel()
                self._deadline = None

        def _too_slow(self, seconds: float, part: str) -> None:
            self._deadline = None
            if self.transport.is_closing():
                return
            if (
                self.cycle is None
                or self.cycle.response_complete
                or not self.cycle.response_started
            ):
                message = f"the request's {part} did not arrive within {seconds:g} s"
                self.transport.write(_error_response(b"408 Request Timeout", "INVALID_ARGUMENT", message, part))  # fmt: skip
            self.transport.close()  # (a body cut off: the app's receive() says disconnected)

        def data_received(self, data: bytes) -> None:
            if self._deadline is None and (self.cycle is None or self.cycle.response_complete):
                self._arm(limits.header_timeout, "headers")  # a next request's first bytes
            super().data_received(data)

        def on_headers_complete(self) -> None:
            self._arm(limits.body_timeout, "body")
            super().on_headers_complete()

        def on_message_complete(self) -> None:
            self._disarm()
            super().on_message_complete()

        def handle_websocket_upgrade(self) -> None:
            self._disarm()  # a WebSocket is a long-lived connection of its own
            super().handle_websocket_upgrade()

        def connection_lost(self, exc: Exception | None) -> None:
            self._disarm()
            super().connection_lost(exc)

    return LimitedHttp


class RateLimitedLog(logging.Filter):
    """At most `burst` records of one kind (logger, message template) per `interval` s."""

    def __init__(self, burst: int = 10, interval: float = 60.0) -> None:
        super().__init__()
        self.burst, self.interval = burst, interval
        self._kinds: dict[tuple[str, object], tuple[float, int, int]] = {}  # start, passed, dropped

    def filter(self, record: logging.LogRecord) -> bool:
        key = (record.name, record.msg)
        now = time.monotonic()
        start, passed, dropped = self._kinds.get(key, (now, 0, 0))
        if now - start >= self.interval:
            start, passed = now, 0
        if passed >= self.burst:
            self._kinds[key] = (start, passed, dropped + 1)
            return False
        if dropped:
            record.msg = f"{record.msg} ({dropped} more like it were not logged)"
        self._kinds[key] = (start, passed + 1, 0)
        if len(self._kinds) > 10_000:  # templates are few; a flood of distinct ones is not kept
            self._kinds.clear()
        return True


def replayed(message: Message, receive: Receive) -> Receive:
    """`receive` with `message` given first: a request body a middleware has read, handed on
    to the app as if it had not been."""
    sent = False

    async def replay() -> Message:
        nonlocal sent
        if not sent:
            sent = True
            return message
        return await receive()

    return replay
