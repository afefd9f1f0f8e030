"""The registry of environments.

Environments are registered by import path so that a heavy backend (a simulator,
a GPU driver) is imported only when that environment is used. Third-party packages
can add environments through the `visenv.envs` entry-point group
(`name = "package.module:Class"`).
"""

from __future__ import annotations

import functools
import importlib
from dataclasses import dataclass
from importlib.metadata import PackageNotFoundError, entry_points, metadata

from .env import EnvConfig, Environment
from .types import EnvError

BUILTIN: dict[str, str] = {
    "sokoban": "env_server.envs.sokoban:SokobanEnv",
    "frozenlake": "env_server.envs.frozenlake:FrozenLakeEnv",
    "navigation": "env_server.envs.navigation:NavigationEnv",
    "primitive_skill": "env_server.envs.primitive_skill:PrimitiveSkillEnv",
    "svg": "env_server.envs.svg:SvgEnv",
    "vicrit": "env_server.envs.vicrit:VicritEnv",
}


@functools.cache
def _entry_point_paths() -> tuple[tuple[str, str], ...]:
    """The `visenv.envs` entry points, scanned once per process (a scan takes ~40 ms)."""
    return tuple((ep.name, ep.value) for ep in entry_points(group="visenv.envs"))


def _all_paths() -> dict[str, str]:
    paths = dict(BUILTIN)
    for name, value in _entry_point_paths():
        paths.setdefault(name, value)
    return paths


@dataclass(frozen=True)
class EnvInfo:
    name: str
    cls: type[Environment] | None
    unavailable: str | None  # why it can't run here; None when it can


def names() -> list[str]:
    return sorted(_all_paths())


def load(name: str) -> type[Environment]:
    """The environment class registered as `name`; EnvError(NOT_FOUND) if unknown."""
    paths = _all_paths()
    if name not in paths:
        raise EnvError(
            f"unknown environment {name!r}; known: {', '.join(sorted(paths))}", code="NOT_FOUND"
        )
    module_name, _, attr = paths[name].partition(":")
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise EnvError(
            f"environment {name!r} cannot be imported here: {exc}. "
            f"Install its extra: pip install 'visenv[{_extra_of(name)}]'",
            code="UNAVAILABLE",
        ) from exc
    return getattr(module, attr)


def _extra_of(name: str) -> str:
    """The pip extra that brings environment `name`: its own (svg, ...), else the server's."""
    try:
        extras = metadata("visenv").get_all("Provides-Extra") or []
    except PackageNotFoundError:  # run from a checkout, not installed
        extras = []
    return name if name in extras else "server"


def info(name: str) -> EnvInfo:
    try:
        cls = load(name)
    except EnvError as exc:
        if exc.code == "NOT_FOUND":
            raise
        return EnvInfo(name, None, exc.message)
    return EnvInfo(name, cls, cls.unavailable_reason())


def available() -> list[str]:
    """Names of the environments that can run on this machine."""
    return [n for n in names() if info(n).unavailable is None]


def make_config(name: str, config: dict | None) -> EnvConfig:
    """Validate a config dict for `name` (pydantic ValidationError names the bad field)."""
    return load(name).Config.model_validate(config or {})


def make(name: str, config: dict | EnvConfig | None = None) -> Environment:
    cls = load(name)
    reason = cls.unavailable_reason()
    if reason is not None:
        raise EnvError(f"environment {name!r} is unavailable here: {reason}", code="UNAVAILABLE")
    if not isinstance(config, EnvConfig):
        config = cls.Config.model_validate(config or {})
    return cls(config)
