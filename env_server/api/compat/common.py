"""What the peers' adapters share: who is calling, the id table, and a reply's parts.

    namespace(headers, query)          -> the caller's credential, hashed (ids live per namespace)
    table = IdTable(max_entries, idle_timeout)
    table.put(ns, client_id, Binding(...)); table.get(ns, client_id); table.pop(ns, client_id)
    png_images(reply) -> [bytes]       info_of(reply, raw_response) -> VAGEN-style info dict

The adapters hold no session logic: every session is an ordinary EnvService session
(counted in /metrics, under the cap, closed by the idle reaper). The table only maps a
peer's ids onto them; it is bounded and forgets entries idle for longer than the
service's idle timeout (the service has closed those sessions by then).
"""

from __future__ import annotations

import collections
import hashlib
import json
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import parse_qs

from fastapi.responses import JSONResponse

from env_server.service.models import ServiceError, SessionReply

PREFIX = "/compat"


def json_bytes(content: Any) -> bytes:
    """`content` as compact UTF-8 JSON that is always writable: a lone surrogate (which
    no request brings, but an environment's text might) goes as its JSON escape
    (backslashreplace writes it as one inside a JSON string), never as an encoding error."""
    text = json.dumps(content, ensure_ascii=False, allow_nan=False, separators=(",", ":"))
    return text.encode("utf-8", "backslashreplace")


class SafeJSONResponse(JSONResponse):
    """A JSON reply written by `json_bytes`: text that reaches a reply never fails it."""

    def render(self, content: Any) -> bytes:
        return json_bytes(content)


def presented_token(headers: Mapping[bytes, bytes], query_string: bytes) -> bytes | None:
    """The credential a request carries: `Authorization: Bearer`, `X-API-Key` (VAGEN) or
    `?token=` (VAGEN, and WebSocket clients that can't set headers); None when none."""
    scheme, _, given = headers.get(b"authorization", b"").partition(b" ")
    if scheme.lower() == b"bearer" and given.strip():
        return given.strip()
    if headers.get(b"x-api-key"):
        return headers[b"x-api-key"].strip()
    tokens = parse_qs(query_string.decode("latin-1")).get("token")
    return tokens[0].encode("latin-1") if tokens else None


def namespace(headers: Mapping[bytes, bytes], query_string: bytes) -> str:
    """The id namespace of a caller: a hash of the credential it presented ('' for none),
    so that two trainers' client-chosen ids (e.g. both "0") never meet."""
    token = presented_token(headers, query_string)
    return "" if token is None else hashlib.sha256(token).hexdigest()[:16]


def request_namespace(scope: Mapping[str, Any]) -> str:
    return namespace(dict(scope["headers"]), scope.get("query_string", b""))


@dataclass
class Binding:
    """One peer id bound to a service session."""

    session_id: str
    env: str
    step_index: int = 0  # the index the next step carries
    system_prompt: str | None = None
    seed: int = 0
    fresh: bool = True  # reset with `seed` and not stepped since: a reset to it is a no-op
    created: float = field(default_factory=time.time)
    last_used: float = field(default_factory=time.monotonic)

    def update(self, reply: SessionReply) -> None:
        self.step_index = reply.step_index
        if reply.system_prompt:  # create/reset replies only
            self.system_prompt = reply.system_prompt
        self.last_used = time.monotonic()


class IdTable:
    """(namespace, peer id) -> Binding; at most `max_entries`, idle ones forgotten."""

    def __init__(self, max_entries: int, idle_timeout: float) -> None:
        self.max_entries = max_entries
        self.idle_timeout = idle_timeout
        self._entries: collections.OrderedDict[tuple[str, str], Binding] = collections.OrderedDict()

    def __len__(self) -> int:
        return len(self._entries)

    def reap(self) -> list[Binding]:
        """Forget the bindings idle for longer than the idle timeout (oldest first)."""
        if self.idle_timeout <= 0:
            return []
        deadline = time.monotonic() - self.idle_timeout
        gone = []
        while self._entries:
            key, binding = next(iter(self._entries.items()))
            if binding.last_used >= deadline:
                break
            gone.append(self._entries.pop(key))
        return gone

    def get(self, ns: str, peer_id: str) -> Binding | None:
        self.reap()
        binding = self._entries.get((ns, peer_id))
        if binding is not None:
            binding.last_used = time.monotonic()
            self._entries.move_to_end((ns, peer_id))  # kept in last-use order for reap()
        return binding

    def room(self) -> int:
        self.reap()
        return self.max_entries - len(self._entries)

    def put(self, ns: str, peer_id: str, binding: Binding) -> None:
        """Bind `peer_id` (the caller checked room() first)."""
        self._entries.pop((ns, peer_id), None)
        self._entries[(ns, peer_id)] = binding

    def pop(self, ns: str, peer_id: str) -> Binding | None:
        return self._entries.pop((ns, peer_id), None)

    def items(self, ns: str) -> list[tuple[str, Binding]]:
        self.reap()
        return [(pid, b) for (n, pid), b in self._entries.items() if n == ns]


def full_error(table: IdTable) -> ServiceError:
    return ServiceError(
        "CAPACITY",
        f"this adapter holds its maximum of {table.max_entries} sessions; close some or retry",
    )


def png_images(reply: SessionReply) -> list[bytes]:
    """The observation's images as PNG files (adapter sessions are created with png)."""
    return [image.data for image in reply.observation.images]


def info_of(reply: SessionReply, raw_response: str | None = None) -> dict[str, Any]:
    """A VAGEN-style info dict: our step info plus what VAGEN's loops read (`success`,
    `metrics.turn_metrics`, `metrics.traj_metrics`, `llm_raw_response`)."""
    info = dict(reply.info)
    valid = bool(info.get("action_valid", True))
    info.update(
        success=reply.success,
        terminated=reply.terminated,
        truncated=reply.truncated,
        reward_parts=reply.reward_parts.to_json(),
        episode=reply.episode,
        turn=reply.turn,
        ground_truth=reply.observation.ground_truth,
        metrics={
            "turn_metrics": {
                "action_is_valid": valid,
                "action_is_effective": int(info.get("actions_executed") or 0) > 0,
            },
            "traj_metrics": {"success": reply.success},
        },
        llm_raw_response=raw_response if raw_response is not None else "",
    )
    return info
