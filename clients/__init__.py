"""visenv client SDK: drive many remote visual-environment sessions over HTTP or gRPC.

It speaks the wire protocol only (docs/wire.md, proto/visenv/v1); it never imports
env_server. The public API, kept stable:

Clients (same methods; the sync one runs the async one on a background thread)
    AsyncEnvClient(servers, *, transport="grpc", token=None, timeout=60.0, retries=3)
    EnvClient(servers, ...)
        servers: "host:port" or a list of them; "grpc://..." / "http://..." pick the
        transport per address. token defaults to $VISENV_TOKEN.
    .list_envs() -> list[EnvSpec]
    .status() -> list[dict | VisenvError]                   one per server
    .create(SessionOptions | [SessionOptions]) -> [SessionReply]
    .reset(session_ids, seeds=None) -> [SessionReply]
    .step(session_ids, responses) -> [SessionReply]         step_index is tracked for you
    .step_actions(session_ids, [[ActionSpec or name]]) -> [SessionReply]
    .get(session_ids) -> [SessionReply]                     current observation, applies nothing
    .close(session_ids) -> [None | VisenvError]
    .attach(session_id, server) -> SessionReply             adopt a session made elsewhere
    .server_of(session_id) -> str
    .run_episodes(policy, env, seeds, *, config, format, representation, reasoning,
                  image_encoding, max_turns, concurrency, on_error, progress) -> [Trajectory]
    Batch calls raise the first item's error; pass return_exceptions=True to get the
    errors in place (list of SessionReply | VisenvError, in request order).
    Use as context managers (`with EnvClient(...)`, `async with AsyncEnvClient(...)`):
    leaving closes the client's sessions and connections.

Data (the dataclasses of visenv.wire, which the server uses too; SessionReply adds `server`)
    SessionOptions(env, config={}, seed=0, format=None, representation=None,
                   reasoning={}, image_encoding=None)
    SessionReply(session_id, env, step_index, episode, turn, observation, reward,
                 reward_parts, terminated, truncated, success, info, system_prompt,
                 server); .done
    Observation(text, images, ground_truth, info); Image(encoding, data, shape)
        .to_array() -> (H, W, 3) uint8; .to_pil()
    RewardParts(env, format, observation, prediction, penalty)
    ActionSpec(name, args=(), payload=None); EnvSpec(...)

Batched episodes (clients.rollout)
    policy(batch: list[PolicyInput]) -> list[str]   (plain or async)
    PolicyInput(episode, seed, turn, system_prompt, observation, history)
        .prompt (turn 0 starts with the system prompt), .images, .messages()
    Trajectory(episode, env, seed, session_id, server, system_prompt, turns,
               final_observation, terminated, truncated, success, error); .ok, .total_reward
    Turn(prompt, images, ground_truth, response, reward, reward_parts, terminated,
         truncated, success, info, policy_seconds, step_seconds)

Errors (clients.errors): VisenvError(code, message, field) and its subclasses
    InvalidArgument, NotFound, SessionLost, CapacityError, PayloadTooLarge,
    FailedPrecondition, Unavailable, Unauthenticated, DeadlineExceeded, InternalError.
    An infrastructure failure always raises (or is recorded in Trajectory.error); it is
    never turned into a zero reward.

gymnasium adapter: clients.gym_env.RemoteEnv (imported lazily: `from clients import RemoteEnv`).
"""

from .client import TOKEN_ENV_VAR, AsyncEnvClient
from .errors import (
    CapacityError,
    DeadlineExceeded,
    FailedPrecondition,
    InternalError,
    InvalidArgument,
    NotFound,
    PayloadTooLarge,
    SessionLost,
    Unauthenticated,
    Unavailable,
    VisenvError,
)
from .rollout import PolicyInput, Trajectory, Turn, run_episodes
from .sync_client import EnvClient
from .types import (
    ActionSpec,
    EnvSpec,
    Image,
    Observation,
    RewardParts,
    SessionOptions,
    SessionReply,
)


def __getattr__(name: str):
    if name == "RemoteEnv":  # gymnasium is imported only when the adapter is used
        from .gym_env import RemoteEnv

        return RemoteEnv
    raise AttributeError(f"module 'clients' has no attribute {name!r}")


__all__ = [
    "TOKEN_ENV_VAR",
    "ActionSpec",
    "AsyncEnvClient",
    "CapacityError",
    "DeadlineExceeded",
    "EnvClient",
    "EnvSpec",
    "FailedPrecondition",
    "Image",
    "InternalError",
    "InvalidArgument",
    "NotFound",
    "Observation",
    "PayloadTooLarge",
    "PolicyInput",
    "RemoteEnv",
    "RewardParts",
    "SessionLost",
    "SessionOptions",
    "SessionReply",
    "Trajectory",
    "Turn",
    "Unauthenticated",
    "Unavailable",
    "VisenvError",
    "run_episodes",
]
