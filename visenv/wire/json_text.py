"""The reply types' cheap forms: their JSON-object fields held as JSON text and decoded
only when read (`JSONText`), and pickling as plain field values (`_reduce_to_fields`,
`_with_json`): replies cross the worker pipe on every step.

The functions `__reduce__` names (`_reduce_to_fields`'s class, `_with_json`) are looked up
by module and name when unpickled: the API process loads what its workers pickled, both
running this same code."""

from __future__ import annotations

import dataclasses
import json
import operator
from typing import Any

_FIELD_GETTERS: dict[type, Any] = {}


def _reduce_to_fields(self: Any) -> tuple[type, tuple]:
    """Pickle a reply dataclass as its class and field values (replies cross the worker
    pipe on every step: this is about 3x cheaper to load than pickle's default)."""
    cls = type(self)
    get = _FIELD_GETTERS.get(cls)
    if get is None:  # per class, so that a subclass (the SDK's reply) keeps its own fields
        get = _FIELD_GETTERS[cls] = operator.attrgetter(*(f.name for f in dataclasses.fields(cls)))
    return cls, get(self)


class JSONText:
    """Lets the JSON-object fields of a reply type be held as their JSON text, decoded only
    when read.

    A worker process writes a reply's ground truth and infos as JSON itself (in parallel
    with the other workers), and the server's API process hands that text to the gRPC
    reply unread instead of loading, checking and writing the objects again (`with_json`;
    the text is `json.dumps`'s with its defaults, what `fill_proto` writes, so the bytes
    on the wire are the same). Reading such a field decodes it once; a field that was read
    or set is written from its value again (`json_text` is None then), so a reader that
    changes the object it got never sends a stale text. Pickled with the text.
    """

    def __getattr__(self, name: str) -> Any:  # only for a field not set yet
        texts = self.__dict__.get("_json")
        if texts is None or name not in texts:
            raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")
        value = json.loads(texts[name])
        self.__dict__[name] = value
        return value

    @classmethod
    def with_json(cls, texts: dict[str, str], **values: Any):
        """An instance whose fields `texts` are given as JSON text, the rest as `values`
        (a field in neither takes its default)."""
        self = object.__new__(cls)
        for f in _field_defaults(cls):
            if f.name not in values and f.name not in texts:
                factory = f.default_factory
                values[f.name] = f.default if factory is dataclasses.MISSING else factory()
        self.__dict__.update(values)
        self.__dict__["_json"] = texts
        post_init = getattr(cls, "__post_init__", None)
        if post_init is not None:
            post_init(self)
        return self

    def json_text(self, name: str) -> str | None:
        """Field `name`'s JSON text while it was neither read nor set; else None."""
        d = self.__dict__
        if name in d:
            return None
        texts = d.get("_json")
        return None if texts is None else texts.get(name)

    def set_json_text(self, name: str, text: str) -> None:
        """Hold field `name` as this JSON text (`json.dumps`'s form) from now on."""
        d = self.__dict__
        d.pop(name, None)
        d["_json"] = {**(d.get("_json") or {}), name: text}

    def _dumps(self, name: str) -> str:
        """Field `name` as JSON text: the text it came as, or its value written now."""
        text = self.json_text(name)
        return json.dumps(getattr(self, name)) if text is None else text

    def __reduce__(self) -> tuple:
        d = self.__dict__
        texts = d.get("_json")
        if texts is not None:
            texts = {k: v for k, v in texts.items() if k not in d}
        if not texts:
            return _reduce_to_fields(self)
        names = _field_names(type(self))
        return _with_json, (type(self), tuple(d.get(n) for n in names), texts)


_FIELD_NAMES: dict[type, tuple[str, ...]] = {}


def _field_names(cls: type) -> tuple[str, ...]:
    names = _FIELD_NAMES.get(cls)
    if names is None:
        names = _FIELD_NAMES[cls] = tuple(f.name for f in dataclasses.fields(cls))
    return names


_FIELD_DEFAULTS: dict[type, tuple[dataclasses.Field, ...]] = {}


def _field_defaults(cls: type) -> tuple[dataclasses.Field, ...]:
    """The fields of `cls` that have a default (or a default factory)."""
    found = _FIELD_DEFAULTS.get(cls)
    if found is None:
        missing = dataclasses.MISSING
        found = _FIELD_DEFAULTS[cls] = tuple(
            f
            for f in dataclasses.fields(cls)
            if f.default is not missing or f.default_factory is not missing
        )
    return found


def _with_json(cls: type, values: tuple, texts: dict[str, str]) -> Any:
    """Unpickle a `JSONText` instance (its fields held as text are None in `values`)."""
    self = object.__new__(cls)
    d = self.__dict__
    for name, value in zip(_field_names(cls), values, strict=True):
        if name not in texts:
            d[name] = value
    d["_json"] = texts
    return self
