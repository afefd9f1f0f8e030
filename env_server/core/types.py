"""Step and observation types shared by every environment.

An environment never sees free text: it receives `Action`s (the wire's type,
`visenv.wire.Action`, re-exported here) that `reasoning/` parsed from the agent's
response or that a client sent as explicit actions, and answers with an `Observation`
(on reset) or a `Transition` (on step), in the spirit of dm_env's explicit step types.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from enum import Enum
from functools import cached_property
from itertools import chain
from typing import Any

import numpy as np

# one action type from the wire to the environment, re-exported for the environments
from visenv.wire import Action as Action

IMAGE_PLACEHOLDER = "<image>"


class ResponseFormat(str, Enum):
    """How the agent must lay out its response: the VAGEN paper's five reasoning formats
    (parsed strictly), and VAGEN main's formats (`vagen_*`, parsed as VAGEN main does)."""

    NO_THINK = "no_think"
    FREE_THINK = "free_think"
    GROUNDING = "grounding"
    WORLDMODELING = "worldmodeling"
    GROUNDING_WORLDMODELING = "grounding_worldmodeling"
    VAGEN_FREE_THINK = "vagen_free_think"
    VAGEN_WM = "vagen_wm"
    VAGEN_FREE_WM = "vagen_free_wm"
    VAGEN_NO_THINK = "vagen_no_think"
    VAGEN_EVAL_MODE = "vagen_eval_mode"


class Representation(str, Enum):
    """How a ground-truth state is written as text."""

    NATURAL = "natural"
    SYMBOLIC = "symbolic"
    STRUCTURED = "structured"


class ActionKind(str, Enum):
    """The shape of an environment's actions, which tells `reasoning/` how to parse them."""

    DISCRETE = "discrete"  # bare names separated by ",": "Left, Up"
    CALL = "call"  # names with numeric arguments: "pick(10, 20, 30), place(0, 0, 40)"
    DOCUMENT = "document"  # one whole document as the action (an SVG file)


@dataclass(frozen=True)
class ActionSpace:
    """The actions an environment accepts.

    `names` are the canonical spellings; `arity` gives the number of numeric
    arguments of each CALL action; `max_per_turn` bounds how many actions one
    response may hold (extra ones make the response invalid).
    """

    kind: ActionKind
    names: tuple[str, ...]
    max_per_turn: int
    arity: dict[str, int] = field(default_factory=dict)
    description: str = ""
    # VAGEN main's spellings of the names (its spelling -> ours), where they differ: VAGEN
    # main's formats (vagen_*) take only these, as VAGEN main does; the others take both
    vagen_names: dict[str, str] = field(default_factory=dict)

    def lookup(self, name: str, vagen: bool = False) -> str | None:
        """The canonical spelling of `name` (case-insensitive), or None if unknown.
        `vagen`: `name` as VAGEN main's formats write it (see `vagen_names`)."""
        return self._spellings[1 if vagen else 0].get(name.strip().lower())

    @cached_property
    def _spellings(self) -> tuple[dict[str, str], dict[str, str]]:
        """Lower-cased spelling -> canonical name, made once: for our formats (the names,
        then VAGEN main's spellings) and for VAGEN main's (its spellings only, where it has
        any). The first of two equal spellings wins."""

        def table(pairs: Iterable[tuple[str, str]]) -> dict[str, str]:
            out: dict[str, str] = {}
            for spelling, canonical in pairs:
                out.setdefault(spelling.lower(), canonical)
            return out

        ours = table([*((n, n) for n in self.names), *self.vagen_names.items()])
        return ours, table(self.vagen_names.items()) if self.vagen_names else ours

    def vagen_name(self, canonical: str) -> str:
        """How VAGEN main's formats write the action `canonical`."""
        return next((v for v, c in self.vagen_names.items() if c == canonical), canonical)

    def to_json(self) -> dict[str, Any]:
        return {
            "kind": self.kind.value,
            "names": list(self.names),
            "max_per_turn": self.max_per_turn,
            "arity": dict(self.arity),
            "description": self.description,
        }


@dataclass
class Observation:
    """What the agent is shown: text with one `<image>` placeholder per image."""

    text: str
    images: list[np.ndarray]  # RGB, uint8, shape (H, W, 3)
    ground_truth: dict[str, Any]
    info: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        placeholders = self.text.count(IMAGE_PLACEHOLDER)
        if placeholders != len(self.images):
            raise ValueError(
                f"observation text has {placeholders} {IMAGE_PLACEHOLDER} placeholders "
                f"but {len(self.images)} images"
            )


@dataclass
class Transition:
    """The result of one `step` call (a whole turn: up to max_per_turn actions).

    `reward` is the environment's own reward for the turn (format and world-model
    rewards are added by `reasoning/`). `actions_executed` counts the actions that
    were applied; `invalid_actions` lists those that were refused (with a reason),
    which are reported, never raised.
    """

    observation: Observation
    reward: float
    terminated: bool
    truncated: bool
    success: bool
    actions_executed: int
    invalid_actions: list[str] = field(default_factory=list)
    info: dict[str, Any] = field(default_factory=dict)

    @property
    def done(self) -> bool:
        return self.terminated or self.truncated


def plain(value: Any, where: str = "value") -> Any:
    """`value` as plain JSON types (dict with str keys, list, str, int, float, bool, None).

    numpy scalars and arrays become Python numbers and lists, tuples and sets become
    lists. Anything else raises TypeError naming where it sits (e.g. "ground_truth.cubes[1]"),
    so that a reply that could not be encoded is caught where it is built, not in the API.
    A dict or list that is plain already is returned as it is, not copied.

    Every reply's ground truth and info pass through here (a Sokoban reply holds ~130
    values): the walk dispatches on the exact type, copies only what it must change, and
    names the place of a bad value only once one was found, by walking again (`_named`).
    """
    try:
        return _plain(value)
    except TypeError:
        _named(value, where)  # raises the TypeError that says where
        raise


_SCALARS = frozenset({str, int, float, bool, type(None)})
_LIST = {list}


def _plain(value: Any) -> Any:
    kind = type(value)
    if kind in _SCALARS:
        return value
    if kind is dict:
        for n, (key, item) in enumerate(value.items()):  # noqa: B007  (n is read below)
            if type(key) is not str:
                break
            if type(item) not in _SCALARS:
                done = _plain(item)
                if done is not item:
                    break
        else:
            return value
        # from the n-th entry on something changes: a new dict
        out = {}
        for m, (key, item) in enumerate(value.items()):
            if m < n:
                out[key] = item
            elif m == n and type(key) is str:
                out[key] = done
            else:
                out[_key(key)] = _plain(item)
        return out
    if kind is list:
        kinds = set(map(type, value))  # the checks of plain lists run in C:
        if kinds <= _SCALARS:  # a position, a list of names
            return value
        if kinds == _LIST and _SCALARS.issuperset(map(type, chain.from_iterable(value))):
            return value  # a list of positions (a room's walls)
        for n, item in enumerate(value):
            if type(item) not in _SCALARS:
                done = _plain(item)
                if done is not item:
                    return [*value[:n], done, *(_plain(v) for v in value[n + 1 :])]
        return value
    if kind is tuple:
        return [_plain(item) for item in value]
    # subclasses (IntEnum, numpy's float64, OrderedDict, ...), numpy values, sets
    if isinstance(value, str | bool):
        return value
    if isinstance(value, int):
        return int(value)
    if isinstance(value, float):
        return float(value)
    if isinstance(value, np.generic):
        return value.item()
    if isinstance(value, dict):
        return {_key(key): _plain(item) for key, item in value.items()}
    if isinstance(value, list | tuple):
        return [_plain(item) for item in value]
    if isinstance(value, np.ndarray):
        return value.tolist()
    if isinstance(value, set | frozenset):
        return [_plain(item) for item in sorted(value, key=repr)]
    raise TypeError(f"{type(value).__name__} is not a plain JSON type")


def _key(key: Any) -> str:
    if isinstance(key, np.generic):
        key = key.item()
    if not isinstance(key, str | int | float | bool) and key is not None:
        raise TypeError(f"key of type {type(key).__name__} is not JSON")
    return key if isinstance(key, str) else str(key)


def _named(value: Any, where: str) -> None:
    """Raise the TypeError of the first value in `value` that `_plain` refuses, naming where
    it sits; return if there is none."""
    if isinstance(value, dict):
        for key, item in value.items():
            if isinstance(key, np.generic):
                key = key.item()
            if not isinstance(key, (str, int, float, bool)) and key is not None:
                raise TypeError(f"{where}: key {key!r} of type {type(key).__name__} is not JSON")
            _named(item, f"{where}.{key}")
    elif isinstance(value, (list, tuple)):
        for n, item in enumerate(value):
            _named(item, f"{where}[{n}]")
    elif isinstance(value, (set, frozenset)):
        for item in sorted(value, key=repr):
            _named(item, f"{where}[]")
    elif not (value is None or isinstance(value, (bool, str, int, float, np.generic, np.ndarray))):
        raise TypeError(f"{where}: {type(value).__name__} {value!r:.80} is not a plain JSON type")


class EnvError(Exception):
    """An error an environment raises for bad configuration or bad use.

    `code` is one of the wire error codes (INVALID_ARGUMENT, FAILED_PRECONDITION,
    UNAVAILABLE, ...), `field` the request field at fault when there is one. The service
    turns it into a structured error reply.
    """

    def __init__(
        self, message: str, code: str = "INVALID_ARGUMENT", field: str | None = None
    ) -> None:
        super().__init__(message)
        self.code = code
        self.message = message
        self.field = field
