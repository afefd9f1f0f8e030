"""The wire protocol's types, once: error codes, replies, requests, and their JSON and
proto forms (docs/wire.md; proto/visenv/v1/visenv.proto is the source).

Both the server (env_server/) and the SDK (clients/) import this package; it imports
neither of them (nor trainer/): only the code generated from the .proto. One module per
idea, every public name re-exported here (`from visenv import wire; wire.SessionReply`):

- `errors`: the error codes (`ERROR_CODES`, read from the proto enum `ErrorCode` and its
  options, and the maps derived from it: `HTTP_STATUS`, `GRPC_STATUS`, `code_of_http`,
  `code_of_grpc`), `Error`, `InvalidField`.
- `replies`: `SessionReply` (`Observation`, `Image`, `RewardParts`), `EnvSpec`.
- `requests`: as clients build them: `SessionOptions`, `StepItem` (`Action`, also the
  environments' action type), `ResetItem`, `ForkItem`. The server reads requests into its
  own validated models (env_server/service/models.py), straight from the JSON or the proto.
- `convert`: the requests' JSON and proto forms and the server's reading of their
  messages (`to_proto`, `to_json`, `fields_of`, `from_fields`), generated from the proto
  descriptor read against each request dataclass.
- `envelopes`: the batch calls' envelopes (`BatchItem`, `BatchResponse`, ... as
  TypedDicts for the OpenAPI document) and their JSON and proto forms.
- `json_text`: `JSONText`, reply fields held as JSON text until read, and the replies'
  cheap pickling.
- `channel`: the client side of gRPC (`Channel`, `open_channel`, `CHANNEL_OPTIONS`);
  `stream`: the `Calls` stream's method table, shared with the server.
- `schema`: how pydantic reads these types for the OpenAPI document.

Each type has `to_json` / `from_json` (docs/wire.md's JSON, images as base64) and
`to_proto` / `from_proto` (free-form JSON objects as text in `*_json` fields).
"""

from __future__ import annotations

from .channel import CHANNEL_OPTIONS, MAX_MESSAGE_BYTES, STREAM_MAX_BYTES, Channel, open_channel
from .convert import fields_of, from_fields, to_json, to_proto
from .envelopes import (
    Answer,
    BatchItem,
    BatchResponse,
    CloseResponse,
    CloseResult,
    ErrorReply,
    ForkedSessions,
    ForkResponse,
    ForkResult,
    Forks,
    Limits,
    ListEnvsResponse,
    batch_from_json,
    batch_from_proto,
    batch_item_json,
    batch_to_proto,
    close_from_json,
    close_from_proto,
    close_item_json,
    close_to_proto,
    fork_from_json,
    fork_from_proto,
    fork_item_json,
    fork_to_proto,
    frames_from_proto,
    frames_to_proto,
    step_request,
)
from .errors import (
    CODE_METADATA_KEY,
    ERROR_CODES,
    GRPC_STATUS,
    HTTP_STATUS,
    Error,
    ErrorCode,
    ErrorLike,
    InvalidField,
    code_of_grpc,
    code_of_http,
    json_object,
    rpc_error_code,
)
from .json_text import JSONText
from .replies import EnvSpec, Image, ImageEncoding, Observation, RewardParts, SessionReply
from .requests import Action, ActionSpec, ForkItem, ResetItem, SessionOptions, StepItem
from .stream import STREAMED, STREAMED_CALLS

__all__ = [
    # errors
    "CODE_METADATA_KEY",
    "ERROR_CODES",
    "GRPC_STATUS",
    "HTTP_STATUS",
    "Error",
    "ErrorCode",
    "ErrorLike",
    "InvalidField",
    "code_of_grpc",
    "code_of_http",
    "json_object",
    "rpc_error_code",
    # replies
    "EnvSpec",
    "Image",
    "ImageEncoding",
    "JSONText",
    "Observation",
    "RewardParts",
    "SessionReply",
    # requests
    "Action",
    "ActionSpec",
    "ForkItem",
    "ResetItem",
    "SessionOptions",
    "StepItem",
    # the requests' conversions, read off the proto descriptor
    "fields_of",
    "from_fields",
    "to_json",
    "to_proto",
    # envelopes
    "Answer",
    "BatchItem",
    "BatchResponse",
    "CloseResponse",
    "CloseResult",
    "ErrorReply",
    "ForkResponse",
    "ForkResult",
    "ForkedSessions",
    "Forks",
    "Limits",
    "ListEnvsResponse",
    "batch_from_json",
    "batch_from_proto",
    "batch_item_json",
    "batch_to_proto",
    "close_from_json",
    "close_from_proto",
    "close_item_json",
    "close_to_proto",
    "fork_from_json",
    "fork_from_proto",
    "fork_item_json",
    "fork_to_proto",
    "frames_from_proto",
    "frames_to_proto",
    "step_request",
    # gRPC: the client's channel, the Calls stream's table
    "CHANNEL_OPTIONS",
    "MAX_MESSAGE_BYTES",
    "STREAMED",
    "STREAMED_CALLS",
    "STREAM_MAX_BYTES",
    "Channel",
    "open_channel",
]
