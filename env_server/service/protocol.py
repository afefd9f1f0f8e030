"""`SessionService`: what the adapters (REST, gRPC, the compat routes) call, and so what
both `EnvService` (sessions on this server's workers) and `GatewayService` (sessions on
upstream servers) implement. tests/service/test_session_service_contract.py checks that
the two answer every call the same, over both transports.

Batch-first, answered per item, in order: an item is a model or a plain dict (validated
by the service, one by one, so a bad item gets its own INVALID_ARGUMENT naming the field),
answered with its reply or its `ServiceError`. A whole call is refused by raising a
`ServiceError` (e.g. more items than `max_batch_items`).

Also here, the rules every implementation answers with the same words: `validate` (an
item), `check_env` (an environment name) and `check_batch` (a call's number of items).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence, Sized
from typing import Any, Protocol, TypeVar, runtime_checkable

from pydantic import BaseModel, ValidationError

from .metrics import Metrics
from .models import (
    EnvSpec,
    ForkItem,
    ResetItem,
    Result,
    ServiceError,
    SessionOptions,
    SessionReply,
    StepItem,
)

M = TypeVar("M", bound=BaseModel)


@runtime_checkable
class SessionService(Protocol):
    env_specs: dict[str, EnvSpec]  # every environment it knows, by name (`enabled` served)
    metrics: Metrics

    async def start(self) -> None: ...
    async def stop(self) -> None: ...
    async def wait_started(self) -> None:
        """Return once calls can be served; raise UNAVAILABLE if that won't be soon."""

    def envs_ready(self) -> dict[str, bool]:
        """Per enabled environment: served now without a warm-up."""

    async def list_envs(self) -> list[EnvSpec]: ...
    def limits(self) -> dict[str, Any]:
        """The limits every request is held to (GET /v1/limits, docs/wire.md)."""

    async def create(self, items: Sequence[SessionOptions | Mapping[str, Any]]) -> list[Result]: ...
    async def reset(self, items: Sequence[ResetItem | Mapping[str, Any]]) -> list[Result]: ...
    async def step(self, items: Sequence[StepItem | Mapping[str, Any]]) -> list[Result]: ...
    async def get(self, session_ids: Sequence[str]) -> list[Result]:
        """Each session's last reply; nothing applied."""

    async def close(self, session_ids: Sequence[str]) -> list[ServiceError | None]:
        """None: closed."""

    async def fork(
        self, items: Sequence[ForkItem | Mapping[str, Any]]
    ) -> list[list[SessionReply] | ServiceError]:
        """Each item's n forks' replies, or its one error."""

    async def frame(self, session_id: str) -> bytes:
        """PNG of the latest image the session showed; raises its `ServiceError`."""

    async def health(self) -> dict[str, Any]: ...


def validate(model: type[M], item: M | Mapping[str, Any] | ServiceError) -> M | ServiceError:
    """An item as the model, or its INVALID_ARGUMENT naming the field; an item the
    adapter parsed (or refused: its ServiceError) as it is."""
    if isinstance(item, model | ServiceError):
        return item
    try:
        return model.model_validate(item)
    except ValidationError as exc:
        return ServiceError.from_validation(exc)


def check_env(env_specs: Mapping[str, EnvSpec], name: str) -> ServiceError | None:
    """Why environment `name` can't be served from `env_specs`, or None if it can (the
    error names the environments served: a gateway knows only those)."""
    spec = env_specs.get(name)
    enabled = sorted(n for n, s in env_specs.items() if s.enabled)
    if spec is None:
        return ServiceError("NOT_FOUND", f"unknown environment {name!r}; enabled: {enabled}", "env")
    if not spec.available:
        return ServiceError(
            "UNAVAILABLE", f"environment {name!r} can't run here: {spec.unavailable_reason}", "env"
        )
    if not spec.enabled:
        return ServiceError(
            "NOT_FOUND",
            f"environment {name!r} is not enabled on this server; enabled: {enabled}",
            "env",
        )
    return None


def check_batch(items: Sized, limit: int, field: str = "items") -> None:
    """Refuse a call of more items than `limit` (max_batch_items), at once, naming it."""
    if len(items) > limit:
        raise ServiceError(
            "INVALID_ARGUMENT",
            f"{field}: {len(items)} items in one call, over this server's limit of "
            f"{limit} items per call (max_batch_items, GET /v1/limits); split the batch",
            field,
        )


def unknown_session(session_id: str) -> ServiceError:
    """What a call on a session id that no server holds (or ever held) answers."""
    return ServiceError("NOT_FOUND", f"no session {session_id!r}", "session_id")


def check_actions(spec: EnvSpec, actions: Sequence[Any] | None, most: int) -> ServiceError | None:
    """Why a step's explicit `actions` can't go to environment `spec`, or None: more than
    `most` (max_actions_per_step), numbers given to an action that takes none (a
    discrete name, e.g. Left; a call action's count is the environment's to judge), or a
    payload given to an environment whose actions are not documents."""
    if actions is None:
        return None
    if len(actions) > most:
        return ServiceError(
            "INVALID_ARGUMENT",
            f"actions: {len(actions)} actions in one step, over this server's "
            f"limit of {most} (max_actions_per_step, GET /v1/limits)",
            "actions",
        )
    space = spec.action_space or {}
    takes = {name.lower(): n for name, n in space.get("arity", {}).items()}
    for pos, action in enumerate(actions):
        if action.payload is not None and space.get("kind", "document") != "document":
            return ServiceError(
                "INVALID_ARGUMENT",
                f"actions.{pos}.payload: {spec.name}'s actions take no payload (only a "
                "document action, e.g. svg's, does)",
                f"actions.{pos}.payload",
            )
        if action.args and not takes.get(action.name.strip().lower()):
            return ServiceError(
                "INVALID_ARGUMENT",
                f"actions.{pos}.args: action {action.name!r} takes no arguments, "
                f"{len(action.args)} given",
                f"actions.{pos}.args",
            )
    return None
