"""The messages' conversions, generated from one declaration: a request (visenv.wire.requests)
or reply (visenv.wire.replies) dataclass is declared against its protobuf message
(`@declared(pb.StepItem)`), and its proto form, its REST JSON (both ways) and the server's
reading of a request are derived from the message's descriptor, read field by field against
the dataclass's attributes (as dm_env_rpc's message_utils reads its descriptors). Nothing
is written per field.

The conventions, in this one place:

- a string field `X_json` carries attribute `X`, a JSON object, as JSON text
  ({} <-> "", as empty);
- an `optional` field (one with presence) is None when unset;
- an `optional` field whose attribute defaults to the field's empty value (a reply's
  `system_prompt = ""`) reads unset as it, and is sent (proto and JSON) only when it is
  not empty;
- a repeated field is a tuple (a list in JSON and in `fields_of`);
- a `bytes` field is base64 text in JSON (an image's data);
- a message field is the declared dataclass of that message; a message whose one field is
  repeated (`ActionList`) only wraps it, and stands for the tuple of its items;
- a reply type (a `JSONText`: `SessionReply`, `Observation`) holds its `X_json` fields as
  the text they came as, decoded only when read: read from a message, they stay text;
  written to one, they are always sent (`{}` too), the text itself when still held;
- a `oneof` is its members as attributes: the last member given (not None) is sent, as
  protobuf keeps the last one set; none given sends the first member's empty value
  (a StepItem with neither response nor actions sends an empty response);
- REST's JSON has the attributes' names; None is left out, and so is an empty repeated
  field (absent on the proto wire too), but not a wrapper message or a oneof member, whose
  presence says something (a StepItem's `actions: []`). Read back (`from_json`), a missing
  key takes the attribute's default (else the proto's empty value), and numbers are cast
  to the field's type (JSON's 10 is a double's 10.0).

The conversions are compiled once per type (as `dataclasses` writes `__init__`), from
source written off the descriptor, so they cost what hand-written code does: a step batch
converts 64 items per call. `source(cls)` shows that code.

- `to_proto(obj)` / `fill(obj, out)`: dataclass (or dict) -> message;
- `fields_of(msg)`: message -> its set fields as plain values (what the server validates);
- `to_json(obj)`: dataclass -> REST's JSON object;
- `from_fields(cls, fields)`: plain fields (a dict, or an object with those attributes:
  a pydantic model) -> dataclass;
- `from_message(cls, msg)` / `from_json(cls, data)`: a message / REST's JSON -> dataclass
  (`cls` may be a subclass, its own fields given as keywords: the SDK's reply's `server`).
"""

from __future__ import annotations

import base64
import dataclasses
import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, TypeVar

from google.protobuf.descriptor import Descriptor, FieldDescriptor
from google.protobuf.message import Message

from .errors import json_object
from .json_text import JSONText

T = TypeVar("T")
JSON_SUFFIX = "_json"


@dataclass(frozen=True)
class Field:
    """One proto field read against its dataclass attribute."""

    proto: str  # the field's name in the message
    attr: str  # the attribute's name, and REST's JSON key
    kind: str  # scalar | bytes | optional | json | repeated | message | messages | wrapper
    item: type | None = None  # message(s)/wrapper: the dataclass of the items (None: scalars)
    inner: str = ""  # wrapper: the wrapper message's repeated field (ActionList.actions)
    oneof: str | None = None  # the (real) oneof it is a member of
    empty: Any = None  # the value a oneof's first member sends when none is given
    default: Any = None  # optional, json: the attribute's value when the field is unset
    cast: str = ""  # scalar: float, int or bool (JSON's numbers are cast to it)


@dataclass
class Conversions:
    """A declared dataclass's conversions (compiled from `source`)."""

    cls: type
    message: type[Message]
    fields: tuple[Field, ...]
    source: str
    fill: Callable[[Any, Message], None]
    fields_of: Callable[[Message], dict[str, Any]]
    to_json: Callable[[Any], dict[str, Any]]
    from_attrs: Callable[[Any], Any]
    from_message: Callable[[Message, type, dict[str, Any]], Any]
    from_json: Callable[[Mapping[str, Any], type, dict[str, Any]], Any]


_BY_CLASS: dict[type, Conversions] = {}
_BY_MESSAGE: dict[str, Conversions] = {}  # by the message's full name
_BY_MESSAGE_TYPE: dict[type[Message], Conversions] = {}
_INHERITED: dict[type, Conversions] = {}  # a subclass of a declared class: its parent's


def declared(message: type[Message], reply: bool = False) -> Callable[[type[T]], type[T]]:
    """Class decorator: the dataclass is `message`'s; its conversions are compiled now, and
    a field of either without a counterpart in the other raises (at import). `reply`: its
    JSON has every field (an empty list too), but an optional one at its default."""

    def declare(cls: type[T]) -> type[T]:
        conv = _compile(cls, message, reply)
        _BY_CLASS[cls] = conv
        _BY_MESSAGE[message.DESCRIPTOR.full_name] = conv
        _BY_MESSAGE_TYPE[message] = conv
        return cls

    return declare


def conversions(cls: type) -> Conversions:
    """The conversions of `cls`, a declared dataclass (or a subclass of one)."""
    conv = _BY_CLASS.get(cls) or _INHERITED.get(cls)
    if conv is not None:
        return conv
    for klass in cls.__mro__:
        if klass in _BY_CLASS:
            conv = _INHERITED[cls] = _BY_CLASS[klass]  # (the SDK's reply: once, not per call)
            return conv
    raise TypeError(f"{cls.__name__} is not declared against a protobuf message")


def to_proto(obj: Any, message: type[Message] | None = None) -> Message:
    """`obj` (a declared dataclass, or a dict of its fields with `message`) as its message."""
    if isinstance(obj, Mapping):
        if message is None:
            raise TypeError("to_proto of a dict needs its message class")
        obj = from_fields(_BY_MESSAGE[message.DESCRIPTOR.full_name].cls, obj)
    conv = conversions(type(obj))
    out = conv.message()
    conv.fill(obj, out)
    return out


def fill(obj: Any, out: Message) -> None:
    """Write `obj`'s fields into `out`, an empty message of its type (e.g. a `.add()`)."""
    (_BY_CLASS.get(type(obj)) or conversions(type(obj))).fill(obj, out)


def fields_of(msg: Message) -> dict[str, Any]:
    """The fields `msg` sets, by attribute name, as plain values (nested messages as dicts,
    repeated fields as lists, `*_json` text as its object: `InvalidField` if not one)."""
    conv = _BY_MESSAGE_TYPE.get(type(msg)) or _BY_MESSAGE[msg.DESCRIPTOR.full_name]
    return conv.fields_of(msg)


def to_json(obj: Any) -> dict[str, Any]:
    """`obj` as REST's JSON object (docs/wire.md)."""
    return (_BY_CLASS.get(type(obj)) or conversions(type(obj))).to_json(obj)


def from_fields(cls: type[T], fields: Mapping[str, Any] | Any) -> T:
    """A `cls` of plain fields by attribute name: a dict (missing: the default), or an
    object with every one as an attribute (a validated pydantic model: compiled, as it
    is on the gateway's step path); nested items alike, repeated fields as tuples."""
    if not isinstance(fields, Mapping):
        return from_attrs(cls)(fields)
    kwargs: dict[str, Any] = {}
    for f in conversions(cls).fields:
        if f.attr not in fields:
            continue
        value = fields[f.attr]
        if value is None and f.kind in ("repeated", "messages"):
            continue  # the default: empty
        if value is not None and f.kind in ("repeated", "messages", "wrapper"):
            item = f.item
            value = tuple(value if item is None else (from_fields(item, x) for x in value))
        kwargs[f.attr] = value
    return cls(**kwargs)


def from_message(cls: type[T], msg: Message, **extra: Any) -> T:
    """A `cls` read from `msg` (`extra`: a subclass's own fields)."""
    return conversions(cls).from_message(msg, cls, extra)


def from_json(cls: type[T], data: Mapping[str, Any], **extra: Any) -> T:
    """A `cls` read from REST's JSON object (`extra`: a subclass's own fields)."""
    return conversions(cls).from_json(data, cls, extra)


def from_attrs(cls: type[T]) -> Callable[[Any], T]:
    """The compiled `from_fields` of `cls` for an object with its attributes."""
    return conversions(cls).from_attrs


def source(cls: type) -> str:
    """The code compiled for `cls`'s conversions."""
    return conversions(cls).source


# ---- reading the descriptor -------------------------------------------------------------


def _real_oneof(f: FieldDescriptor) -> str | None:
    """The oneof `f` is a member of, but not the one protoc makes for an `optional` field."""
    o = f.containing_oneof
    if o is None or (len(o.fields) == 1 and o.name == "_" + f.name):
        return None
    return o.name


_CASTS = {
    FieldDescriptor.CPPTYPE_DOUBLE: "float",
    FieldDescriptor.CPPTYPE_FLOAT: "float",
    FieldDescriptor.CPPTYPE_INT32: "int",
    FieldDescriptor.CPPTYPE_INT64: "int",
    FieldDescriptor.CPPTYPE_UINT32: "int",
    FieldDescriptor.CPPTYPE_UINT64: "int",
    FieldDescriptor.CPPTYPE_BOOL: "bool",
}


def _field(f: FieldDescriptor, owner: str, defaults: dict[str, Any]) -> Field:
    """`defaults`: the dataclass's default of each attribute that has one."""
    oneof = _real_oneof(f)
    empty = None if f.message_type is not None or f.is_repeated else f.default_value
    if f.message_type is not None:
        inner = f.message_type.fields
        if not f.is_repeated and len(inner) == 1 and inner[0].is_repeated:  # a list wrapper
            return Field(f.name, f.name, "wrapper", _item(inner[0]), inner[0].name, oneof, ())
        if f.is_repeated:
            return Field(f.name, f.name, "messages", _item(f), oneof=oneof)
        if oneof:
            raise TypeError(f"{owner}.{f.name}: a nested message in a oneof")
        return Field(f.name, f.name, "message", _item(f))
    if f.is_repeated:
        return Field(f.name, f.name, "repeated", oneof=oneof)
    if f.name.endswith(JSON_SUFFIX) and f.type == FieldDescriptor.TYPE_STRING and not oneof:
        attr = f.name[: -len(JSON_SUFFIX)]
        return Field(f.name, attr, "json", default=defaults.get(attr, {}))
    if f.type == FieldDescriptor.TYPE_BYTES and not f.has_presence:
        return Field(f.name, f.name, "bytes")
    if f.has_presence:  # an attribute defaulting to the empty value reads unset as it
        default = defaults.get(f.name)
        default = default if default == f.default_value and oneof is None else None
        return Field(f.name, f.name, "optional", None, "", oneof, empty, default)
    return Field(
        f.name, f.name, "scalar", oneof=oneof, empty=empty, cast=_CASTS.get(f.cpp_type, "")
    )


def _item(f: FieldDescriptor) -> type | None:
    """The declared dataclass of a repeated field's messages (None: scalars)."""
    if f.message_type is None:
        return None
    conv = _BY_MESSAGE.get(f.message_type.full_name)
    if conv is None:
        raise TypeError(f"{f.full_name}: message {f.message_type.name} is not declared")
    return conv.cls


def _defaults(cls: type) -> dict[str, Any]:
    """The default of each of `cls`'s attributes that has one (a factory's: called)."""
    out = {}
    for f in dataclasses.fields(cls):
        if f.default is not dataclasses.MISSING:
            out[f.name] = f.default
        elif f.default_factory is not dataclasses.MISSING:
            out[f.name] = f.default_factory()
    return out


def _compile(cls: type, message: type[Message], reply: bool) -> Conversions:
    desc: Descriptor = message.DESCRIPTOR
    fields = tuple(_field(f, desc.name, _defaults(cls)) for f in desc.fields)
    attrs = {f.name for f in dataclasses.fields(cls)}
    declared_attrs = {f.attr for f in fields}
    if attrs != declared_attrs:
        raise TypeError(
            f"{cls.__name__} and {desc.full_name} disagree: attributes without a proto field "
            f"{sorted(attrs - declared_attrs)}, proto fields without an attribute "
            f"{sorted(declared_attrs - attrs)}"
        )
    items = {f.item.__name__: _BY_CLASS[f.item] for f in fields if f.item is not None}
    lazy = issubclass(cls, JSONText)  # its JSON fields held as text
    order = [f.name for f in dataclasses.fields(cls)]  # __init__'s, for positional args
    code = "\n".join(
        [
            _fill_source(fields, lazy),
            _fields_of_source(fields),
            _to_json_source(fields, reply),
            _from_attrs_source(fields, order),
            _from_message_source(fields, lazy),
            _from_json_source(fields),
        ]
    )
    namespace: dict[str, Any] = {
        "_dumps": json.dumps,
        "_loads": json.loads,
        "_json_object": json_object,
        "_b64": lambda b: base64.b64encode(b).decode("ascii"),
        "_unb64": base64.b64decode,
        "_cls": cls,
        **{f"_fill_{name}": conv.fill for name, conv in items.items()},
        **{f"_fields_{name}": conv.fields_of for name, conv in items.items()},
        **{f"_json_{name}": conv.to_json for name, conv in items.items()},
        **{f"_attrs_{name}": conv.from_attrs for name, conv in items.items()},
        **{f"_msg_{name}": conv.from_message for name, conv in items.items()},
        **{f"_fromjson_{name}": conv.from_json for name, conv in items.items()},
        **{f"_{name}": conv.cls for name, conv in items.items()},
    }
    exec(compile(code, f"<visenv.wire.convert {cls.__name__}>", "exec"), namespace)  # noqa: S102
    return Conversions(
        cls,
        message,
        fields,
        code,
        namespace["fill"],
        namespace["fields_of"],
        namespace["to_json"],
        namespace["from_attrs"],
        namespace["from_message"],
        namespace["from_json"],
    )


def _groups(fields: tuple[Field, ...]) -> list[list[Field]]:
    """The fields in order, each oneof's members together at its first member's place."""
    groups: list[list[Field]] = []
    seen: dict[str, list[Field]] = {}
    for f in fields:
        if f.oneof is None:
            groups.append([f])
        elif f.oneof in seen:
            seen[f.oneof].append(f)
        else:
            seen[f.oneof] = [f]
            groups.append(seen[f.oneof])
    return groups


# ---- the code written off the descriptor ---------------------------------------------------


def _put(f: Field) -> list[str]:
    """Lines that set `f` on message `out` from `v` (given: not None)."""
    if f.kind in ("scalar", "bytes", "optional"):
        return [f"out.{f.proto} = v"]
    if f.kind == "json":
        return [f"out.{f.proto} = _dumps(v)"]
    if f.kind == "message":
        return [f"_fill_{f.item.__name__}(v, out.{f.proto})"]
    if f.kind == "repeated":
        return [f"out.{f.proto}.extend(v)"]
    target = f"out.{f.proto}"
    lines = []
    if f.kind == "wrapper":
        lines = [f"m = out.{f.proto}", "m.SetInParent()"]
        target = f"m.{f.inner}"
    if f.item is None:
        return [*lines, f"{target}.extend(v)"]
    return [*lines, f"add = {target}.add", "for x in v:", f"    _fill_{f.item.__name__}(x, add())"]


def _unchanged(f: Field) -> str:
    """The test that `v`, `f`'s value, is not sent: None, or an optional's other default."""
    return "v is None" if f.default is None else f"v is None or v == {f.default!r}"


def _fill_source(fields: tuple[Field, ...], lazy: bool) -> str:
    lines = ["def fill(o, out):"]
    for group in _groups(fields):
        f = group[0]
        if f.oneof is not None:  # the last member given, else the first one empty
            for i, member in enumerate(reversed(group)):
                lines.append(f"    {'if' if i == 0 else 'elif'} o.{member.attr} is not None:")
                lines += [f"        v = o.{member.attr}"] + [f"        {s}" for s in _put(member)]
            lines += ["    else:", f"        v = {f.empty!r}"] + [f"        {s}" for s in _put(f)]
        elif f.kind in ("scalar", "bytes"):
            lines.append(f"    out.{f.proto} = o.{f.attr}")
        elif f.kind == "json" and lazy:  # always sent; the text it came as, if still held
            lines.append(f"    out.{f.proto} = o._dumps({f.attr!r})")
        else:  # an empty JSON object or repeated field is left unset, as is None
            test = "v" if f.kind in ("json", "repeated") else f"not ({_unchanged(f)})"
            lines += [f"    v = o.{f.attr}", f"    if {test}:"]
            lines += [f"        {s}" for s in _put(f)]
    return "\n".join(lines + ["", ""])


def _get(f: Field) -> str:
    """The plain value of `f` on message `m`."""
    if f.kind in ("scalar", "bytes", "optional"):
        return f"m.{f.proto}"
    if f.kind == "json":
        return f"_json_object(m.{f.proto}, {f.proto!r})"
    if f.kind == "message":
        return f"_fields_{f.item.__name__}(m.{f.proto})"
    items = f"m.{f.proto}.{f.inner}" if f.kind == "wrapper" else f"m.{f.proto}"
    if f.item is None:
        return f"list({items})"
    return f"[_fields_{f.item.__name__}(x) for x in {items}]"


def _fields_of_source(fields: tuple[Field, ...]) -> str:
    always = [f for f in fields if f.kind in ("scalar", "bytes", "json", "repeated", "messages")]
    literal = ", ".join(f"{f.attr!r}: {_get(f)}" for f in always if f.oneof is None)
    lines = ["def fields_of(m):", f"    d = {{{literal}}}"]
    for group in _groups(fields):
        f = group[0]
        if f.oneof is not None:
            lines.append(f"    w = m.WhichOneof({f.oneof!r})")
            for i, member in enumerate(group):
                lines.append(f"    {'if' if i == 0 else 'elif'} w == {member.proto!r}:")
                lines.append(f"        d[{member.attr!r}] = {_get(member)}")
        elif f not in always:
            lines.append(f"    if m.HasField({f.proto!r}):")
            lines.append(f"        d[{f.attr!r}] = {_get(f)}")
    return "\n".join(lines + ["    return d", "", ""])


def _json_value(f: Field, v: str = "v") -> str:
    """REST's JSON of `f`'s value `v`."""
    if f.kind in ("scalar", "optional", "json"):
        return v
    if f.kind == "bytes":
        return f"_b64({v})"
    if f.kind == "message":
        return f"_json_{f.item.__name__}({v})"
    if f.item is None:
        return f"list({v})"
    return f"[_json_{f.item.__name__}(x) for x in {v}]"


def _to_json_source(fields: tuple[Field, ...], reply: bool) -> str:
    """A reply's JSON has every field but an optional one at its default; a request's
    leaves out None and empty lists."""
    kinds = ("scalar", "json", "bytes", "message") + (("repeated", "messages") if reply else ())
    always = [f for f in fields if f.kind in kinds and f.oneof is None]
    literal = ", ".join(f"{f.attr!r}: {_json_value(f, f'o.{f.attr}')}" for f in always)
    lines = ["def to_json(o):", f"    d = {{{literal}}}"]
    for group in _groups(fields):
        f = group[0]
        if f.oneof is not None:
            for i, member in enumerate(reversed(group)):
                lines.append(f"    {'if' if i == 0 else 'elif'} o.{member.attr} is not None:")
                lines += [
                    f"        v = o.{member.attr}",
                    f"        d[{member.attr!r}] = {_json_value(member)}",
                ]
            lines += [
                "    else:",
                f"        v = {f.empty!r}",
                f"        d[{f.attr!r}] = {_json_value(f)}",
            ]
        elif f not in always:
            test = "v" if f.kind in ("repeated", "messages") else f"not ({_unchanged(f)})"
            lines += [
                f"    v = o.{f.attr}",
                f"    if {test}:",
                f"        d[{f.attr!r}] = {_json_value(f)}",
            ]
    return "\n".join(lines + ["    return d", ""])


def _read_one(f: Field, x: str, reader: str) -> str:
    """Code reading `x`, one item of message field `f`, by the compiled reader of its
    dataclass: `_attrs` (from_attrs), `_msg` (from_message) or `_fromjson` (from_json)."""
    name = f.item.__name__
    return f"{reader}_{name}({x})" if reader == "_attrs" else f"{reader}_{name}({x}, _{name}, {{}})"


def _tuple_of(f: Field, items: str, reader: str) -> str:
    """Code for the tuple of `items` (an expression): scalars as they are, messages each
    read by `_read_one`."""
    if f.item is None:
        return f"tuple({items})"
    return f"tuple([{_read_one(f, 'x', reader)} for x in {items}])"


def _from_attrs_source(fields: tuple[Field, ...], order: list[str]) -> str:
    def value(f: Field) -> str:
        get = f"s.{f.attr}"
        if f.kind in ("scalar", "bytes", "optional", "json"):
            return get
        read = _read_one(f, get, "_attrs") if f.kind == "message" else _tuple_of(f, get, "_attrs")
        return f"None if {get} is None else {read}"

    by_attr = {f.attr: f for f in fields}
    args = ", ".join(value(by_attr[attr]) for attr in order)
    return "\n".join(["def from_attrs(s):", f"    return _cls({args})", ""])


def _from_message_source(fields: tuple[Field, ...], lazy: bool) -> str:
    """`from_message(m, cls, extra)`: the dataclass read from message `m` (a reply type's
    JSON fields kept as their text: `JSONText.with_json`)."""

    def value(f: Field) -> str:
        get = f"m.{f.proto}"
        if f.kind in ("scalar", "bytes"):
            return get
        if f.kind == "optional" or (f.oneof is not None and f.kind != "wrapper"):
            return f"{get} if m.HasField({f.proto!r}) else {f.default!r}"
        if f.kind == "json":
            return f"_loads({get}) if {get} else {f.default!r}"
        if f.kind == "repeated":
            return f"tuple({get})"
        if f.kind == "message":
            return _read_one(f, get, "_msg")
        if f.kind == "wrapper":
            return (
                f"{_tuple_of(f, f'{get}.{f.inner}', '_msg')} if m.HasField({f.proto!r}) else None"
            )
        return _tuple_of(f, get, "_msg")

    texts = [f for f in fields if lazy and f.kind == "json"]
    args = ", ".join(f"{f.attr}={value(f)}" for f in fields if f not in texts)
    if texts:
        held = ", ".join(f"{f.attr!r}: m.{f.proto} or '{{}}'" for f in texts)
        body = f"cls.with_json({{{held}}}, {args}, **extra)"
    else:
        body = f"cls({args}, **extra)"
    return "\n".join(["def from_message(m, cls, extra):", f"    return {body}", ""])


def _from_json_source(fields: tuple[Field, ...]) -> str:
    """`from_json(d, cls, extra)`: the dataclass read from REST's JSON object `d`."""

    def value(f: Field) -> str:
        get = f"g({f.attr!r})"
        if f.kind == "scalar":
            if f.cast == "bool":
                return f"bool({get})"
            if f.cast:
                return f"{f.cast}({get} or 0)"
            return f"{get} or ''"
        if f.kind == "bytes":
            return f"_unb64({get} or '')"
        if f.kind == "optional":
            return get if f.default is None else f"{get} or {f.default!r}"
        if f.kind == "json":
            return f"{get} or {f.default!r}"
        if f.kind == "repeated":
            return f"tuple({get} or ())"
        if f.kind == "message":
            return _read_one(f, f"{get} or {{}}", "_fromjson")
        read = _tuple_of(f, get, "_fromjson")
        if f.kind == "wrapper":
            return f"None if {get} is None else {read}"
        return f"{read} if {get} else ()"

    args = ", ".join(f"{f.attr}={value(f)}" for f in fields)
    return "\n".join(
        ["def from_json(d, cls, extra):", "    g = d.get", f"    return cls({args}, **extra)", ""]
    )
