"""The environment contract, step/observation types and the registry."""

from .env import EnvConfig, Environment, StatePrompt, check_seed
from .types import (
    IMAGE_PLACEHOLDER,
    Action,
    ActionKind,
    ActionSpace,
    EnvError,
    Observation,
    Representation,
    ResponseFormat,
    Transition,
    plain,
)

__all__ = [
    "IMAGE_PLACEHOLDER",
    "Action",
    "ActionKind",
    "ActionSpace",
    "EnvConfig",
    "StatePrompt",
    "check_seed",
    "EnvError",
    "Environment",
    "Observation",
    "Representation",
    "ResponseFormat",
    "Transition",
    "plain",
]
