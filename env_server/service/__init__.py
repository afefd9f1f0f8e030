"""The session service (see service.py, which coordinates sessions.py, pool.py and rewards.py)."""

from .models import (
    EnvSpec,
    ResetItem,
    RewardParts,
    ServiceError,
    SessionOptions,
    SessionReply,
    StepItem,
)
from .service import EnvService
from .settings import Settings

__all__ = [
    "EnvService",
    "EnvSpec",
    "ResetItem",
    "RewardParts",
    "ServiceError",
    "SessionOptions",
    "SessionReply",
    "Settings",
    "StepItem",
]
