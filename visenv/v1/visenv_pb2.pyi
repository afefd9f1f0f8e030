from google.protobuf import descriptor_pb2 as _descriptor_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class ErrorCode(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    ERROR_CODE_UNSPECIFIED: _ClassVar[ErrorCode]
    INVALID_ARGUMENT: _ClassVar[ErrorCode]
    NOT_FOUND: _ClassVar[ErrorCode]
    SESSION_LOST: _ClassVar[ErrorCode]
    CAPACITY: _ClassVar[ErrorCode]
    PAYLOAD_TOO_LARGE: _ClassVar[ErrorCode]
    FAILED_PRECONDITION: _ClassVar[ErrorCode]
    UNAVAILABLE: _ClassVar[ErrorCode]
    UNAUTHENTICATED: _ClassVar[ErrorCode]
    INTERNAL: _ClassVar[ErrorCode]
    DEADLINE_EXCEEDED: _ClassVar[ErrorCode]
ERROR_CODE_UNSPECIFIED: ErrorCode
INVALID_ARGUMENT: ErrorCode
NOT_FOUND: ErrorCode
SESSION_LOST: ErrorCode
CAPACITY: ErrorCode
PAYLOAD_TOO_LARGE: ErrorCode
FAILED_PRECONDITION: ErrorCode
UNAVAILABLE: ErrorCode
UNAUTHENTICATED: ErrorCode
INTERNAL: ErrorCode
DEADLINE_EXCEEDED: ErrorCode
HTTP_STATUS_FIELD_NUMBER: _ClassVar[int]
http_status: _descriptor.FieldDescriptor
GRPC_STATUS_FIELD_NUMBER: _ClassVar[int]
grpc_status: _descriptor.FieldDescriptor
ALSO_HTTP_STATUS_FIELD_NUMBER: _ClassVar[int]
also_http_status: _descriptor.FieldDescriptor
ALSO_GRPC_STATUS_FIELD_NUMBER: _ClassVar[int]
also_grpc_status: _descriptor.FieldDescriptor
CLIENT_ONLY_FIELD_NUMBER: _ClassVar[int]
client_only: _descriptor.FieldDescriptor

class Image(_message.Message):
    __slots__ = ("encoding", "data", "shape")
    ENCODING_FIELD_NUMBER: _ClassVar[int]
    DATA_FIELD_NUMBER: _ClassVar[int]
    SHAPE_FIELD_NUMBER: _ClassVar[int]
    encoding: str
    data: bytes
    shape: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, encoding: _Optional[str] = ..., data: _Optional[bytes] = ..., shape: _Optional[_Iterable[int]] = ...) -> None: ...

class Observation(_message.Message):
    __slots__ = ("text", "images", "ground_truth_json", "info_json")
    TEXT_FIELD_NUMBER: _ClassVar[int]
    IMAGES_FIELD_NUMBER: _ClassVar[int]
    GROUND_TRUTH_JSON_FIELD_NUMBER: _ClassVar[int]
    INFO_JSON_FIELD_NUMBER: _ClassVar[int]
    text: str
    images: _containers.RepeatedCompositeFieldContainer[Image]
    ground_truth_json: str
    info_json: str
    def __init__(self, text: _Optional[str] = ..., images: _Optional[_Iterable[_Union[Image, _Mapping]]] = ..., ground_truth_json: _Optional[str] = ..., info_json: _Optional[str] = ...) -> None: ...

class RewardParts(_message.Message):
    __slots__ = ("env", "format", "observation", "prediction", "penalty")
    ENV_FIELD_NUMBER: _ClassVar[int]
    FORMAT_FIELD_NUMBER: _ClassVar[int]
    OBSERVATION_FIELD_NUMBER: _ClassVar[int]
    PREDICTION_FIELD_NUMBER: _ClassVar[int]
    PENALTY_FIELD_NUMBER: _ClassVar[int]
    env: float
    format: float
    observation: float
    prediction: float
    penalty: float
    def __init__(self, env: _Optional[float] = ..., format: _Optional[float] = ..., observation: _Optional[float] = ..., prediction: _Optional[float] = ..., penalty: _Optional[float] = ...) -> None: ...

class SessionReply(_message.Message):
    __slots__ = ("session_id", "env", "step_index", "episode", "turn", "observation", "reward", "reward_parts", "terminated", "truncated", "success", "info_json", "system_prompt")
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    ENV_FIELD_NUMBER: _ClassVar[int]
    STEP_INDEX_FIELD_NUMBER: _ClassVar[int]
    EPISODE_FIELD_NUMBER: _ClassVar[int]
    TURN_FIELD_NUMBER: _ClassVar[int]
    OBSERVATION_FIELD_NUMBER: _ClassVar[int]
    REWARD_FIELD_NUMBER: _ClassVar[int]
    REWARD_PARTS_FIELD_NUMBER: _ClassVar[int]
    TERMINATED_FIELD_NUMBER: _ClassVar[int]
    TRUNCATED_FIELD_NUMBER: _ClassVar[int]
    SUCCESS_FIELD_NUMBER: _ClassVar[int]
    INFO_JSON_FIELD_NUMBER: _ClassVar[int]
    SYSTEM_PROMPT_FIELD_NUMBER: _ClassVar[int]
    session_id: str
    env: str
    step_index: int
    episode: int
    turn: int
    observation: Observation
    reward: float
    reward_parts: RewardParts
    terminated: bool
    truncated: bool
    success: bool
    info_json: str
    system_prompt: str
    def __init__(self, session_id: _Optional[str] = ..., env: _Optional[str] = ..., step_index: _Optional[int] = ..., episode: _Optional[int] = ..., turn: _Optional[int] = ..., observation: _Optional[_Union[Observation, _Mapping]] = ..., reward: _Optional[float] = ..., reward_parts: _Optional[_Union[RewardParts, _Mapping]] = ..., terminated: _Optional[bool] = ..., truncated: _Optional[bool] = ..., success: _Optional[bool] = ..., info_json: _Optional[str] = ..., system_prompt: _Optional[str] = ...) -> None: ...

class Error(_message.Message):
    __slots__ = ("code", "message", "field", "error_id")
    CODE_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    FIELD_FIELD_NUMBER: _ClassVar[int]
    ERROR_ID_FIELD_NUMBER: _ClassVar[int]
    code: str
    message: str
    field: str
    error_id: str
    def __init__(self, code: _Optional[str] = ..., message: _Optional[str] = ..., field: _Optional[str] = ..., error_id: _Optional[str] = ...) -> None: ...

class BatchItem(_message.Message):
    __slots__ = ("reply", "error")
    REPLY_FIELD_NUMBER: _ClassVar[int]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    reply: SessionReply
    error: Error
    def __init__(self, reply: _Optional[_Union[SessionReply, _Mapping]] = ..., error: _Optional[_Union[Error, _Mapping]] = ...) -> None: ...

class BatchResponse(_message.Message):
    __slots__ = ("results",)
    RESULTS_FIELD_NUMBER: _ClassVar[int]
    results: _containers.RepeatedCompositeFieldContainer[BatchItem]
    def __init__(self, results: _Optional[_Iterable[_Union[BatchItem, _Mapping]]] = ...) -> None: ...

class ListEnvsRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class EnvInfo(_message.Message):
    __slots__ = ("name", "description", "available", "unavailable_reason", "config_schema_json", "action_space_json", "enabled")
    NAME_FIELD_NUMBER: _ClassVar[int]
    DESCRIPTION_FIELD_NUMBER: _ClassVar[int]
    AVAILABLE_FIELD_NUMBER: _ClassVar[int]
    UNAVAILABLE_REASON_FIELD_NUMBER: _ClassVar[int]
    CONFIG_SCHEMA_JSON_FIELD_NUMBER: _ClassVar[int]
    ACTION_SPACE_JSON_FIELD_NUMBER: _ClassVar[int]
    ENABLED_FIELD_NUMBER: _ClassVar[int]
    name: str
    description: str
    available: bool
    unavailable_reason: str
    config_schema_json: str
    action_space_json: str
    enabled: bool
    def __init__(self, name: _Optional[str] = ..., description: _Optional[str] = ..., available: _Optional[bool] = ..., unavailable_reason: _Optional[str] = ..., config_schema_json: _Optional[str] = ..., action_space_json: _Optional[str] = ..., enabled: _Optional[bool] = ...) -> None: ...

class ListEnvsResponse(_message.Message):
    __slots__ = ("envs", "limits_json")
    ENVS_FIELD_NUMBER: _ClassVar[int]
    LIMITS_JSON_FIELD_NUMBER: _ClassVar[int]
    envs: _containers.RepeatedCompositeFieldContainer[EnvInfo]
    limits_json: str
    def __init__(self, envs: _Optional[_Iterable[_Union[EnvInfo, _Mapping]]] = ..., limits_json: _Optional[str] = ...) -> None: ...

class SessionOptions(_message.Message):
    __slots__ = ("env", "config_json", "seed", "format", "representation", "reasoning_json", "image_encoding")
    ENV_FIELD_NUMBER: _ClassVar[int]
    CONFIG_JSON_FIELD_NUMBER: _ClassVar[int]
    SEED_FIELD_NUMBER: _ClassVar[int]
    FORMAT_FIELD_NUMBER: _ClassVar[int]
    REPRESENTATION_FIELD_NUMBER: _ClassVar[int]
    REASONING_JSON_FIELD_NUMBER: _ClassVar[int]
    IMAGE_ENCODING_FIELD_NUMBER: _ClassVar[int]
    env: str
    config_json: str
    seed: int
    format: str
    representation: str
    reasoning_json: str
    image_encoding: str
    def __init__(self, env: _Optional[str] = ..., config_json: _Optional[str] = ..., seed: _Optional[int] = ..., format: _Optional[str] = ..., representation: _Optional[str] = ..., reasoning_json: _Optional[str] = ..., image_encoding: _Optional[str] = ...) -> None: ...

class CreateRequest(_message.Message):
    __slots__ = ("items",)
    ITEMS_FIELD_NUMBER: _ClassVar[int]
    items: _containers.RepeatedCompositeFieldContainer[SessionOptions]
    def __init__(self, items: _Optional[_Iterable[_Union[SessionOptions, _Mapping]]] = ...) -> None: ...

class ResetItem(_message.Message):
    __slots__ = ("session_id", "seed", "image_encoding")
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    SEED_FIELD_NUMBER: _ClassVar[int]
    IMAGE_ENCODING_FIELD_NUMBER: _ClassVar[int]
    session_id: str
    seed: int
    image_encoding: str
    def __init__(self, session_id: _Optional[str] = ..., seed: _Optional[int] = ..., image_encoding: _Optional[str] = ...) -> None: ...

class ResetRequest(_message.Message):
    __slots__ = ("items",)
    ITEMS_FIELD_NUMBER: _ClassVar[int]
    items: _containers.RepeatedCompositeFieldContainer[ResetItem]
    def __init__(self, items: _Optional[_Iterable[_Union[ResetItem, _Mapping]]] = ...) -> None: ...

class Action(_message.Message):
    __slots__ = ("name", "args", "payload")
    NAME_FIELD_NUMBER: _ClassVar[int]
    ARGS_FIELD_NUMBER: _ClassVar[int]
    PAYLOAD_FIELD_NUMBER: _ClassVar[int]
    name: str
    args: _containers.RepeatedScalarFieldContainer[float]
    payload: str
    def __init__(self, name: _Optional[str] = ..., args: _Optional[_Iterable[float]] = ..., payload: _Optional[str] = ...) -> None: ...

class ActionList(_message.Message):
    __slots__ = ("actions",)
    ACTIONS_FIELD_NUMBER: _ClassVar[int]
    actions: _containers.RepeatedCompositeFieldContainer[Action]
    def __init__(self, actions: _Optional[_Iterable[_Union[Action, _Mapping]]] = ...) -> None: ...

class StepItem(_message.Message):
    __slots__ = ("session_id", "step_index", "response", "actions", "image_encoding")
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    STEP_INDEX_FIELD_NUMBER: _ClassVar[int]
    RESPONSE_FIELD_NUMBER: _ClassVar[int]
    ACTIONS_FIELD_NUMBER: _ClassVar[int]
    IMAGE_ENCODING_FIELD_NUMBER: _ClassVar[int]
    session_id: str
    step_index: int
    response: str
    actions: ActionList
    image_encoding: str
    def __init__(self, session_id: _Optional[str] = ..., step_index: _Optional[int] = ..., response: _Optional[str] = ..., actions: _Optional[_Union[ActionList, _Mapping]] = ..., image_encoding: _Optional[str] = ...) -> None: ...

class StepRequest(_message.Message):
    __slots__ = ("items",)
    ITEMS_FIELD_NUMBER: _ClassVar[int]
    items: _containers.RepeatedCompositeFieldContainer[StepItem]
    def __init__(self, items: _Optional[_Iterable[_Union[StepItem, _Mapping]]] = ...) -> None: ...

class GetRequest(_message.Message):
    __slots__ = ("session_ids",)
    SESSION_IDS_FIELD_NUMBER: _ClassVar[int]
    session_ids: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, session_ids: _Optional[_Iterable[str]] = ...) -> None: ...

class CloseRequest(_message.Message):
    __slots__ = ("session_ids",)
    SESSION_IDS_FIELD_NUMBER: _ClassVar[int]
    session_ids: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, session_ids: _Optional[_Iterable[str]] = ...) -> None: ...

class CloseResult(_message.Message):
    __slots__ = ("ok", "error")
    OK_FIELD_NUMBER: _ClassVar[int]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    ok: bool
    error: Error
    def __init__(self, ok: _Optional[bool] = ..., error: _Optional[_Union[Error, _Mapping]] = ...) -> None: ...

class CloseResponse(_message.Message):
    __slots__ = ("results",)
    RESULTS_FIELD_NUMBER: _ClassVar[int]
    results: _containers.RepeatedCompositeFieldContainer[CloseResult]
    def __init__(self, results: _Optional[_Iterable[_Union[CloseResult, _Mapping]]] = ...) -> None: ...

class FrameRequest(_message.Message):
    __slots__ = ("session_ids",)
    SESSION_IDS_FIELD_NUMBER: _ClassVar[int]
    session_ids: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, session_ids: _Optional[_Iterable[str]] = ...) -> None: ...

class FrameResult(_message.Message):
    __slots__ = ("png", "error")
    PNG_FIELD_NUMBER: _ClassVar[int]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    png: bytes
    error: Error
    def __init__(self, png: _Optional[bytes] = ..., error: _Optional[_Union[Error, _Mapping]] = ...) -> None: ...

class FrameResponse(_message.Message):
    __slots__ = ("results",)
    RESULTS_FIELD_NUMBER: _ClassVar[int]
    results: _containers.RepeatedCompositeFieldContainer[FrameResult]
    def __init__(self, results: _Optional[_Iterable[_Union[FrameResult, _Mapping]]] = ...) -> None: ...

class ForkItem(_message.Message):
    __slots__ = ("session_id", "n")
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    N_FIELD_NUMBER: _ClassVar[int]
    session_id: str
    n: int
    def __init__(self, session_id: _Optional[str] = ..., n: _Optional[int] = ...) -> None: ...

class ForkRequest(_message.Message):
    __slots__ = ("items",)
    ITEMS_FIELD_NUMBER: _ClassVar[int]
    items: _containers.RepeatedCompositeFieldContainer[ForkItem]
    def __init__(self, items: _Optional[_Iterable[_Union[ForkItem, _Mapping]]] = ...) -> None: ...

class ForkedSessions(_message.Message):
    __slots__ = ("replies",)
    REPLIES_FIELD_NUMBER: _ClassVar[int]
    replies: _containers.RepeatedCompositeFieldContainer[SessionReply]
    def __init__(self, replies: _Optional[_Iterable[_Union[SessionReply, _Mapping]]] = ...) -> None: ...

class ForkResult(_message.Message):
    __slots__ = ("forks", "error")
    FORKS_FIELD_NUMBER: _ClassVar[int]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    forks: ForkedSessions
    error: Error
    def __init__(self, forks: _Optional[_Union[ForkedSessions, _Mapping]] = ..., error: _Optional[_Union[Error, _Mapping]] = ...) -> None: ...

class ForkResponse(_message.Message):
    __slots__ = ("results",)
    RESULTS_FIELD_NUMBER: _ClassVar[int]
    results: _containers.RepeatedCompositeFieldContainer[ForkResult]
    def __init__(self, results: _Optional[_Iterable[_Union[ForkResult, _Mapping]]] = ...) -> None: ...

class StatusRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class StatusResponse(_message.Message):
    __slots__ = ("status_json",)
    STATUS_JSON_FIELD_NUMBER: _ClassVar[int]
    status_json: str
    def __init__(self, status_json: _Optional[str] = ...) -> None: ...

class CallRequest(_message.Message):
    __slots__ = ("id", "list_envs", "create", "reset", "step", "get", "close", "fork", "status", "frame")
    ID_FIELD_NUMBER: _ClassVar[int]
    LIST_ENVS_FIELD_NUMBER: _ClassVar[int]
    CREATE_FIELD_NUMBER: _ClassVar[int]
    RESET_FIELD_NUMBER: _ClassVar[int]
    STEP_FIELD_NUMBER: _ClassVar[int]
    GET_FIELD_NUMBER: _ClassVar[int]
    CLOSE_FIELD_NUMBER: _ClassVar[int]
    FORK_FIELD_NUMBER: _ClassVar[int]
    STATUS_FIELD_NUMBER: _ClassVar[int]
    FRAME_FIELD_NUMBER: _ClassVar[int]
    id: int
    list_envs: ListEnvsRequest
    create: CreateRequest
    reset: ResetRequest
    step: StepRequest
    get: GetRequest
    close: CloseRequest
    fork: ForkRequest
    status: StatusRequest
    frame: FrameRequest
    def __init__(self, id: _Optional[int] = ..., list_envs: _Optional[_Union[ListEnvsRequest, _Mapping]] = ..., create: _Optional[_Union[CreateRequest, _Mapping]] = ..., reset: _Optional[_Union[ResetRequest, _Mapping]] = ..., step: _Optional[_Union[StepRequest, _Mapping]] = ..., get: _Optional[_Union[GetRequest, _Mapping]] = ..., close: _Optional[_Union[CloseRequest, _Mapping]] = ..., fork: _Optional[_Union[ForkRequest, _Mapping]] = ..., status: _Optional[_Union[StatusRequest, _Mapping]] = ..., frame: _Optional[_Union[FrameRequest, _Mapping]] = ...) -> None: ...

class CallResponse(_message.Message):
    __slots__ = ("id", "list_envs", "batch", "close", "fork", "status", "frame", "error")
    ID_FIELD_NUMBER: _ClassVar[int]
    LIST_ENVS_FIELD_NUMBER: _ClassVar[int]
    BATCH_FIELD_NUMBER: _ClassVar[int]
    CLOSE_FIELD_NUMBER: _ClassVar[int]
    FORK_FIELD_NUMBER: _ClassVar[int]
    STATUS_FIELD_NUMBER: _ClassVar[int]
    FRAME_FIELD_NUMBER: _ClassVar[int]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    id: int
    list_envs: ListEnvsResponse
    batch: BatchResponse
    close: CloseResponse
    fork: ForkResponse
    status: StatusResponse
    frame: FrameResponse
    error: Error
    def __init__(self, id: _Optional[int] = ..., list_envs: _Optional[_Union[ListEnvsResponse, _Mapping]] = ..., batch: _Optional[_Union[BatchResponse, _Mapping]] = ..., close: _Optional[_Union[CloseResponse, _Mapping]] = ..., fork: _Optional[_Union[ForkResponse, _Mapping]] = ..., status: _Optional[_Union[StatusResponse, _Mapping]] = ..., frame: _Optional[_Union[FrameResponse, _Mapping]] = ..., error: _Optional[_Union[Error, _Mapping]] = ...) -> None: ...
