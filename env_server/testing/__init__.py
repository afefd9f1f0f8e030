"""Conformance suites that any environment (and any server) can reuse, in the shape of
dm_env_rpc's `compliance/` package: one module per idea.

- `environment_contract`: `EnvironmentContract`, the checks of an `Environment` against the
  contract of `env_server.core` (subclass it in a pytest module), and its helpers;
- `server_contract`: `ServerContract`, the checks of a running server over its wire
  protocol, for one environment and config;
- `wire_client`: the client the server contract speaks through, REST and gRPC written by
  hand, deliberately independent of `visenv.wire`;
- `tiny_env`: `TinyEnv`, a small real environment whose actions and seeds make the
  failures a server must survive (registered by tests as "tiny",
  `env_server.testing:TinyEnv`);
- `launcher`: `launch_server`, a real `visenv serve` subprocess for tests and benches.

Everything public is re-exported here: `from env_server.testing import EnvironmentContract`.
"""

from env_server.testing.environment_contract import (
    UNKNOWN_ACTION,
    EnvironmentContract,
    Frame,
    Run,
    assert_plain_json,
    assert_precondition_error,
    assert_same_frames,
)
from env_server.testing.server_contract import OraclePlan, ServerContract, assert_close_truth
from env_server.testing.tiny_env import TINY_CELL, TINY_PATH, TINY_SPACE, TinyConfig, TinyEnv
from env_server.testing.wire_client import (
    SERVER_TIMEOUT,
    GrpcWire,
    RestWire,
    WireClient,
    decode_image,
)

__all__ = [
    "SERVER_TIMEOUT",
    "TINY_CELL",
    "TINY_PATH",
    "TINY_SPACE",
    "UNKNOWN_ACTION",
    "EnvironmentContract",
    "Frame",
    "GrpcWire",
    "OraclePlan",
    "RestWire",
    "Run",
    "ServerContract",
    "TinyConfig",
    "TinyEnv",
    "WireClient",
    "assert_close_truth",
    "assert_plain_json",
    "assert_precondition_error",
    "assert_same_frames",
    "decode_image",
]
