"""Server settings, read from `VISENV_*` environment variables (pydantic-settings).

Example: `VISENV_WORKERS=4 VISENV_TOKEN=secret visenv serve`. The CLI flags of
`visenv serve` override these.
"""

from __future__ import annotations

import os

from pydantic import Field, field_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from .session_ids import NODE_PATTERN

# a batch reply of more items than this is written off the event loop, in a thread (REST's
# JSON, gRPC's proto message), so that other sessions' calls are answered meanwhile
OFFLOAD_ITEMS = 64


class Settings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="VISENV_", extra="ignore")

    host: str = Field("127.0.0.1", description="Address to listen on (0.0.0.0 for all).")
    port: int = Field(8000, ge=0, le=65535, description="HTTP port (0: pick a free one).")
    grpc_port: int = Field(50051, ge=0, le=65535, description="gRPC port (0: pick a free one).")
    workers: int = Field(
        default_factory=lambda: os.cpu_count() or 1, ge=1, description="Worker processes."
    )
    envs: list[str] | None = Field(
        None, description="Environments to enable (default: every one available here)."
    )
    idle_timeout: float = Field(
        600.0, ge=0, description="Seconds before an idle session is closed (0: never)."
    )
    max_sessions: int = Field(4096, ge=1, description="Cap on open sessions (CAPACITY beyond).")
    max_request_bytes: int = Field(
        8 * 1024 * 1024,
        ge=1024,
        description="Largest request, on every transport (a REST body, a gRPC message).",
    )
    max_batch_items: int = Field(
        4096,
        ge=1,
        description="Most items in one call (a batch create, reset, step, get, close or fork; "
        "a gRPC request's items): a larger one is refused at once, naming this limit.",
    )
    max_actions_per_step: int = Field(
        16,
        ge=1,
        description="Most explicit actions in one step item (every environment's per-turn limit "
        "is smaller; those past that limit are reported in invalid_actions); more is refused.",
    )
    token: str | None = Field(None, description="Bearer token required by every call but health.")
    start_method: str = Field("forkserver", description="multiprocessing start method of workers.")
    env_paths: dict[str, str] = Field(
        default_factory=dict,
        description="Extra environments, name -> 'module:Class' (besides built-ins and entry points).",
    )
    judge_urls: list[str] | None = Field(
        None,
        description="LLM-judge endpoints sessions may use (base URL prefixes, comma-separated); "
        "a session asking for any other is refused.",
    )
    upstreams: list[str] | None = Field(
        None,
        description="Gateway mode: serve no environments here but route sessions to these "
        "visenv servers (host:grpc_port, comma-separated; a name may resolve to many replicas; "
        "NODE=host:grpc_port pins that upstream's node id, as on Kubernetes).",
    )
    node_id: str | None = Field(
        None,
        pattern=NODE_PATTERN,
        description="This server's stable name, part of every session id it makes, by which a "
        "gateway routes to it (a DNS label; default: the host name, on Kubernetes the pod's).",
    )
    upstream_lost_after: float = Field(
        30.0,
        gt=0,
        description="Gateway mode: seconds an upstream may stay unreachable (its sessions "
        "answer UNAVAILABLE, retry) before its sessions are taken for lost (SESSION_LOST).",
    )
    deadline: float = Field(
        60.0,
        gt=0,
        description="Seconds a worker may take to answer one message (at most "
        "`coalesce_max_items` items) before it is taken for stuck (an endless loop in an "
        "environment): it is killed and replaced, and its sessions answer SESSION_LOST. The "
        "clock runs from the worker's last answer, so a worker working through a long queue of "
        "messages is never taken for stuck. Per environment family: `deadlines`.",
    )
    deadlines: dict[str, float] = Field(
        default_factory=lambda: {"primitive_skill": 300.0, "navigation": 120.0},
        description="Per-environment deadlines (JSON: env name -> seconds) over `deadline`; a "
        "message for several environments gets the longest. A ManiSkill primitive takes seconds.",
    )
    piece_items: dict[str, int] = Field(
        default_factory=lambda: {"*": 16, "primitive_skill": 4, "navigation": 8},
        description="Most items per worker message of a batch (JSON: env name -> items, '*' "
        "for the rest; at most `coalesce_max_items`): a batch goes in pieces, one after "
        "another, each of about 20 ms of the worker's measured time per item and at most "
        "this many, so that each piece stays well inside the deadline and other sessions' "
        "calls are answered between pieces (16 frozenlake creates took 0.3 s: they now go "
        "one or two at a time).",
    )
    lost_memory: int = Field(
        100_000, ge=0, description="Lost session ids remembered to answer SESSION_LOST."
    )
    vagen_legacy: bool = Field(
        False,
        description="Serve VAGEN's legacy batch API at /compat/vagen-legacy. Its client sends no "
        "credentials, so those routes take no token: anyone who reaches the port can open "
        "sessions (up to the cap). Enable only on a trusted network.",
    )
    vagen_legacy_max_sessions: int | None = Field(
        None,
        ge=1,
        description="Cap on the legacy adapter's anonymous sessions, apart from the server's "
        "(they count towards max_sessions too), so that they can't lock out token holders "
        "(default: half of max_sessions).",
    )
    coalesce_window: float = Field(
        0.01,
        ge=0,
        le=1.0,
        description="Under concurrent single-session traffic (requests that keep finding a "
        "worker busy), seconds a request on an idle worker waits for others to share its "
        "message (0: never waits). A lone client never waits. Requests that arrive while a "
        "worker's message is in flight are always queued and sent together when it answers.",
    )
    prewarm: list[str] | None = Field(
        default_factory=lambda: ["navigation", "primitive_skill"],
        description="Heavy environments each worker builds once when it starts (shader "
        "compilation, simulator start-up, the first instance's memory), if enabled and "
        "available, so no user's create pays for it (comma-separated; empty: none).",
    )
    coalesce_max_items: int = Field(
        64,
        ge=1,
        description="Most items in one message to a worker: concurrent requests are "
        "coalesced up to it (1: no coalescing), and no piece of a batch is larger "
        "(`piece_items`).",
    )

    header_timeout: float = Field(
        10.0,
        gt=0,
        description="Seconds a request's headers may take to arrive, from its first byte (a "
        "new connection's: from connecting); then 408 and the connection closes (slow-loris). "
        "Also gRPC's handshake.",
    )
    body_timeout: float = Field(
        60.0,
        gt=0,
        description="Seconds a REST request's body may take to arrive after its headers; then "
        "408 and the connection closes.",
    )
    keep_alive_timeout: float = Field(
        15.0, gt=0, description="Seconds an idle HTTP keep-alive connection is kept open."
    )
    grpc_idle_timeout: float = Field(
        300.0,
        gt=0,
        description="Seconds an idle gRPC connection (no call) is kept open; a channel "
        "reconnects by itself on its next call.",
    )
    max_connections: int | None = Field(
        None,
        ge=1,
        description="Most open connections per transport (HTTP, gRPC); one beyond is answered "
        "503 UNAVAILABLE (gRPC: refused) and closed at once (default: half of the descriptors "
        "left after a reserve of 256, the soft limit raised to the hard one: never 'Too many "
        "open files').",
    )
    log_burst: int = Field(
        10,
        ge=1,
        description="Most log lines of one kind (logger and message) a minute; the next one "
        "let through counts those dropped, so no flood fills a disk.",
    )

    @field_validator("envs", "upstreams", "judge_urls", "prewarm", mode="before")
    @classmethod
    def _split(cls, value: object) -> object:
        if isinstance(value, str):
            return [v.strip() for v in value.split(",") if v.strip()] or None
        return value

    @property
    def legacy_cap(self) -> int:
        """The legacy adapter's own cap on sessions (`vagen_legacy_max_sessions`)."""
        return self.vagen_legacy_max_sessions or max(1, self.max_sessions // 2)

    @field_validator("token", mode="before")
    @classmethod
    def _empty_token(cls, value: object) -> object:
        return value or None
