r"""The response formats: their layout, their parsing and action parsing.

The VAGEN paper's five formats, parsed strictly (whitespace is allowed between tags,
nothing else):

    no_think                 <answer>…</answer>
    free_think               <think>…</think><answer>…</answer>
    grounding                <think><observation>…</observation><reasoning>…</reasoning></think><answer>…</answer>
    worldmodeling            <think><reasoning>…</reasoning><prediction>…</prediction></think><answer>…</answer>
    grounding_worldmodeling  <think><observation>…</observation><reasoning>…</reasoning><prediction>…</prediction></think><answer>…</answer>

`parse_response(text, fmt, space)` checks the layout (every required tag once, in
order, no other tags, no text outside the tags, no empty section) and then parses
the answer by `space.kind`:

- DISCRETE: names separated by ",", case-insensitive ("left, UP" -> Left, Up)
- CALL:     "pick(10, 20, 30), place(0, 0, 40)"; argument counts from `space.arity`
- DOCUMENT: the whole answer is one document, optionally in a ``` fence

VAGEN main's formats (github.com/mll-lab-nu/VAGEN, branch main: the parsers in
vagen/envs/{sokoban,frozenlake,navigation,primitive_skill}/utils), parsed as VAGEN main
does: the first place the tags appear in this order (text before and after is ignored),
whitespace only where "\s*" is written below, any text where "…" is:

    vagen_free_think  <think>…</think>\s*<answer>…</answer>
    vagen_wm          <observation>…</observation>\s*<think>…</think>\s*<answer>…</answer>\s*<prediction>…</prediction>
    vagen_free_wm     <observation>…</observation>…<answer>…</answer>…<prediction>…</prediction>
    vagen_no_think    <answer>…</answer>, alone in the response (navigation's no_think)
    vagen_eval_mode   the first <answer>…</answer> anywhere (navigation's eval_mode)

Their answer tag is `cfg.answer_tag` (VAGEN main's navigation writes <action>), their
actions are split on `cfg.action_sep` (empty items dropped) and, as VAGEN main does,
only the first `max_per_turn` are kept. `<think>` (or free_wm's free text) is the
reasoning; `<observation>` and `<prediction>` are graded like the paper's.

A response is either fully valid (`format_ok`, all actions parsed) or invalid with
`error` saying why and no actions: nothing of an invalid response is executed (VAGEN
main's environments execute the valid actions before an unknown one; here an answer
with an unknown action is refused whole).
"""

from __future__ import annotations

import functools
import re
from dataclasses import dataclass

from env_server.core.types import Action, ActionKind, ActionSpace, ResponseFormat
from visenv import formats as layouts
from visenv.formats import VagenLayout

from .config import ReasoningConfig

SEPARATOR = ","
DEFAULTS = ReasoningConfig()

# the layouts (visenv/formats.py, the contract the trainer decodes by too), by format
SECTIONS: dict[ResponseFormat, tuple[str, ...] | None] = {
    ResponseFormat(k): v for k, v in layouts.SECTIONS.items()
}
VAGEN_LAYOUTS: dict[ResponseFormat, VagenLayout] = {
    ResponseFormat(k): v for k, v in layouts.VAGEN_LAYOUTS.items()
}

TAG_NAMES = ("think", "observation", "reasoning", "prediction", "answer")
_TAG = re.compile(r"<(/?)(" + "|".join(TAG_NAMES) + r")\s*>", re.IGNORECASE)
_FENCE = re.compile(r"^```[\w+-]*[ \t]*\n(.*?)\n?```$", re.DOTALL)
_CALL = re.compile(r"^([A-Za-z_][\w-]*)\s*\((.*)\)$", re.DOTALL)


@dataclass
class ParsedResponse:
    """An agent's response taken apart. Sections are stripped text, or None if absent."""

    text: str
    format_ok: bool
    actions: list[Action]
    error: str | None
    think: str | None = None
    observation: str | None = None
    reasoning: str | None = None
    prediction: str | None = None
    answer: str | None = None


def state_sections(fmt: ResponseFormat) -> tuple[str, ...]:
    """The graded sections ("observation", "prediction") a response in `fmt` holds."""
    named = VAGEN_LAYOUTS[fmt].tags if fmt in VAGEN_LAYOUTS else SECTIONS[fmt] or ()
    return tuple(s for s in named if s in ("observation", "prediction"))


@functools.lru_cache(maxsize=256)
def layout(fmt: ResponseFormat, answer_tag: str = "answer") -> str:
    """The skeleton of a response in `fmt`, e.g. '<think>...</think><answer>...</answer>'
    (`answer_tag` names the answer's tag in VAGEN main's formats). Remembered: every
    turn's prompt names it (~1.3 us to write)."""
    if fmt in VAGEN_LAYOUTS:
        spec = VAGEN_LAYOUTS[fmt]
        tags = [answer_tag if t == "answer" else t for t in spec.tags]
        return (" ... " if spec.free_between else "").join(f"<{t}>...</{t}>" for t in tags)
    sections = SECTIONS[fmt]
    if sections == ():
        return "<answer>...</answer>"
    inner = "..." if sections is None else "".join(f"<{s}>...</{s}>" for s in sections)
    return f"<think>{inner}</think><answer>...</answer>"


def expected_tags(fmt: ResponseFormat) -> list[str]:
    """The sequence of tags a response in `fmt` must contain: ['<think>', ..., '</answer>']."""
    return layouts.expected_tags(ResponseFormat(fmt).value)


def parse_response(
    text: str,
    fmt: ResponseFormat | str,
    space: ActionSpace,
    cfg: ReasoningConfig | None = None,
) -> ParsedResponse:
    """Parse `text` as `fmt` and its answer as actions of `space` (`cfg`: the session's
    action separator and VAGEN main's answer tag; defaults when None)."""
    fmt = ResponseFormat(fmt)
    cfg = cfg or DEFAULTS
    if fmt in VAGEN_LAYOUTS:
        return _parse_vagen(text, fmt, space, cfg)
    fields, error = _split_sections(text, fmt)
    parsed = ParsedResponse(text=text, format_ok=False, actions=[], error=error, **fields)
    if error is not None:
        return parsed
    actions, error = parse_actions(parsed.answer or "", space, cfg.action_sep)
    if error is not None:
        parsed.error = error
        return parsed
    parsed.actions = actions
    parsed.format_ok = True
    return parsed


@functools.cache
def _vagen_pattern(fmt: ResponseFormat, answer_tag: str) -> re.Pattern[str]:
    """The expression VAGEN main matches a response in `fmt` with; groups named by section
    ("answer" for the answer whatever its tag), free text between tags in free0, free1, ..."""
    spec = VAGEN_LAYOUTS[fmt]
    pattern = ""
    for i, name in enumerate(spec.tags):
        tag = answer_tag if name == "answer" else name
        if i:
            pattern += rf"(?P<free{i - 1}>.*?)" if spec.free_between else r"\s*"
        pattern += rf"<{tag}>(?P<{name}>.*?)</{tag}>"
    return re.compile(rf"^\s*{pattern}\s*$" if spec.alone else pattern, re.DOTALL)


def _parse_vagen(
    text: str, fmt: ResponseFormat, space: ActionSpace, cfg: ReasoningConfig
) -> ParsedResponse:
    parsed = ParsedResponse(text=text, format_ok=False, actions=[], error=None)
    match = _vagen_pattern(fmt, cfg.answer_tag).search(text)
    if match is None:
        parsed.error = f"no {layout(fmt, cfg.answer_tag)} in the response ({fmt.value} format)"
        return parsed
    found = {k: v.strip() for k, v in match.groupdict().items() if v is not None}
    parsed.observation, parsed.prediction = found.get("observation"), found.get("prediction")
    parsed.answer = found["answer"]
    free = " ".join(found[k] for k in sorted(found) if k.startswith("free") and found[k])
    parsed.think = parsed.reasoning = found.get("think", free if "free0" in found else None)
    if space.kind is ActionKind.DOCUMENT:  # one document: not split
        parsed.actions, parsed.error = parse_actions(parsed.answer, space)
        parsed.format_ok = parsed.error is None
        return parsed
    actions: list[Action] = []
    items = [item.strip() for item in parsed.answer.split(cfg.action_sep) if item.strip()]
    if not items:
        parsed.error = f"empty <{cfg.answer_tag}>: it must hold the action(s)"
        return parsed
    for item in items[: space.max_per_turn]:  # VAGEN main keeps the first max_actions
        action, error = (
            _parse_call(item, space, loose=True)
            if space.kind is ActionKind.CALL
            else _parse_name(item, space, vagen=True)
        )
        if error is not None:
            parsed.error = error
            return parsed
        actions.append(action)
    parsed.actions, parsed.format_ok = actions, True
    return parsed


@functools.cache
def _layout_facts(fmt: ResponseFormat) -> tuple[tuple[str, ...], frozenset[str], frozenset[str]]:
    """Per format, computed once: the expected tags, the allowed tag names and the tags
    whose content is free text."""
    expected = tuple(expected_tags(fmt))
    allowed = frozenset(t.strip("</>") for t in expected)
    content_opens = {"<answer>"} | {f"<{s}>" for s in SECTIONS[fmt] or ()}
    if SECTIONS[fmt] is None:
        content_opens.add("<think>")
    return expected, allowed, frozenset(content_opens)


@functools.cache
def _layout_pattern(fmt: ResponseFormat) -> re.Pattern[str]:
    """The whole of a well-formed response in `fmt`, each section in a group of its name
    (<think>'s group holds its inner sections too). It may accept a response whose sections
    hold tags or are empty; `_split_sections` checks those. ASCII-only case and whitespace:
    whatever else a tag walk accepts (e.g. a non-breaking space between tags) is left to it.
    A section is read up to its first closing tag as runs of one character class between
    "<"s (~3x faster than a lazy `.*?`, which tries the closing tag at every character);
    where `.*?` would have gone on past that tag, the section held a tag: the walk's case
    either way."""

    def section(name: str) -> str:
        return rf"<{name}\s*>(?P<{name}>[^<]*(?:<(?!/{name}\s*>)[^<]*)*)</{name}\s*>"

    sections = SECTIONS[fmt]
    if sections == ():
        body = section("answer")
    elif sections is None:
        body = section("think") + r"\s*" + section("answer")
    else:
        inner = r"\s*".join(section(s) for s in sections)
        body = rf"<think\s*>(?P<think>\s*{inner}\s*)</think\s*>\s*" + section("answer")
    return re.compile(rf"\s*{body}\s*", re.DOTALL | re.IGNORECASE | re.ASCII)


def _split_sections(text: str, fmt: ResponseFormat) -> tuple[dict[str, str | None], str | None]:
    """The stripped sections of `text`, and the first layout error (None if the layout is right).

    A well-formed response is taken apart by one match of the format's pattern; anything
    else (or a match whose sections hold a tag or are empty) goes through the tag walk,
    which says what is wrong. Both give the same sections and errors for every text."""
    match = _layout_pattern(fmt).fullmatch(text)
    if match is not None:
        groups = match.groupdict()
        structured = SECTIONS[fmt] is not None  # <think> holds tags: its sections are checked
        fields: dict[str, str | None] = {}
        for name, value in groups.items():
            stripped = value.strip()
            if not stripped or (
                "<" in value and not (structured and name == "think") and _TAG.search(value)
            ):
                return _walk_sections(text, fmt)
            fields[name] = stripped
        return fields, None
    return _walk_sections(text, fmt)


def _walk_sections(text: str, fmt: ResponseFormat) -> tuple[dict[str, str | None], str | None]:
    """`_split_sections` by walking every tag of `text`: the sections that appear once, and
    the first layout error."""
    expected, allowed, content_opens = _layout_facts(fmt)
    # in free_think anything may be written inside <think>, except our own tags
    matches = list(_TAG.finditer(text))
    names = [m.group(2).lower() for m in matches]
    closing = [bool(m.group(1)) for m in matches]
    found = [f"</{n}>" if c else f"<{n}>" for n, c in zip(names, closing, strict=True)]
    fields: dict[str, str | None] = {}

    opens: dict[str, list[int]] = {}
    closes: dict[str, list[int]] = {}
    for i, (name, close) in enumerate(zip(names, closing, strict=True)):
        (closes if close else opens).setdefault(name, []).append(i)
    for name in TAG_NAMES:
        o, c = opens.get(name, ()), closes.get(name, ())
        if len(o) == 1 and len(c) == 1 and o[0] < c[0]:
            fields[name] = text[matches[o[0]].end() : matches[c[0]].start()].strip()

    def result(error: str | None) -> tuple[dict[str, str | None], str | None]:
        return fields, error

    if found != list(expected):  # the layout is wrong: say how
        for tag, name in zip(found, names, strict=True):
            if name not in allowed:
                return result(f"unexpected {tag} tag: the {fmt.value} format is {layout(fmt)}")
        for tag in dict.fromkeys(expected):
            count = found.count(tag)
            if count == 0:
                return result(f"missing {tag}: the {fmt.value} format is {layout(fmt)}")
            if count > 1:
                return result(f"{tag} appears {count} times; it must appear once")
        return result(
            f"tags out of order: got {''.join(found)}, expected {''.join(expected)} ({layout(fmt)})"
        )

    # text between tags: only whitespace, except inside the sections themselves
    # (and anywhere inside <think> for free_think)
    bounds = [0] + [p for m in matches for p in (m.start(), m.end())] + [len(text)]
    for i in range(len(matches) + 1):
        if i > 0 and found[i - 1] in content_opens:
            continue  # inside a section: its content
        gap = text[bounds[2 * i] : bounds[2 * i + 1]]
        if gap.strip():
            where = "before " + found[i] if i < len(found) else "after " + found[-1]
            return result(f"extra text {where}: {_clip(gap.strip())!r}")

    for name in ("observation", "reasoning", "prediction", "think"):
        if name in fields and name in allowed and not fields[name]:
            if name == "think" and SECTIONS[fmt] is not None:
                continue
            return result(f"empty <{name}> section")
    if not fields.get("answer"):
        return result("empty <answer>: it must hold the action(s)")
    return result(None)


def parse_actions(
    answer: str, space: ActionSpace, sep: str = SEPARATOR
) -> tuple[list[Action], str | None]:
    """Actions in `answer` for `space`, separated by `sep`, or ([], error)."""
    answer = answer.strip()
    if not answer:
        return [], "empty <answer>: it must hold the action(s)"
    if space.kind is ActionKind.DOCUMENT:
        fenced = _FENCE.match(answer)
        document = (fenced.group(1) if fenced else answer).strip()
        if not document:
            return [], "empty document in <answer>"
        return [Action(name=space.names[0], payload=document)], None

    items, error = _split_top_level(answer, sep)
    if error is not None:
        return [], error
    if len(items) > space.max_per_turn:
        return [], (
            f"{len(items)} actions given; at most {space.max_per_turn} per turn "
            f"(separated by '{sep}')"
        )
    actions: list[Action] = []
    for item in items:
        if not item:
            return [], f"empty action in {_clip(answer)!r} (separate actions with '{sep}')"
        action, error = (
            _parse_call(item, space) if space.kind is ActionKind.CALL else _parse_name(item, space)
        )
        if error is not None:
            return [], error
        actions.append(action)
    return actions, None


def _parse_name(
    item: str, space: ActionSpace, vagen: bool = False
) -> tuple[Action | None, str | None]:
    name = space.lookup(item, vagen)
    if name is None:
        names = [space.vagen_name(n) for n in space.names] if vagen else space.names
        return None, f"unknown action {item!r}; valid actions: {', '.join(names)}"
    return Action(name=name), None


def _parse_call(
    item: str, space: ActionSpace, loose: bool = False
) -> tuple[Action | None, str | None]:
    """`name(1, 2, 3)`. `loose` reads a call as VAGEN main does: the name is what comes
    before the first "(", the arguments what comes between it and the next ")"."""
    if loose:
        head, paren, rest = item.partition("(")
        if not paren:
            return None, f"action {item!r} is not a call like name(1, 2, 3)"
        written, raw = head.strip(), rest.split(")")[0]
    else:
        match = _CALL.match(item)
        if match is None:
            return None, f"action {item!r} is not a call like name(1, 2, 3)"
        written, raw = match.group(1), match.group(2)
    name = space.lookup(written)
    if name is None:
        return None, f"unknown action {written!r}; valid actions: {', '.join(space.names)}"
    raw = raw.strip()
    parts = [p.strip() for p in raw.split(",")] if raw else []
    args: list[float] = []
    for part in parts:
        try:
            value = float(part)
        except ValueError:
            return None, f"argument {part!r} of {name} is not a number"
        if value != value or value in (float("inf"), float("-inf")):
            return None, f"argument {part!r} of {name} is not a finite number"
        args.append(value)
    arity = space.arity.get(name)
    if arity is not None and len(args) != arity:
        return None, f"{name} takes {arity} arguments, got {len(args)} in {item!r}"
    return Action(name=name, args=tuple(args)), None


_BRACKETS = re.compile(r"[()\[\]]")


def _split_top_level(answer: str, sep: str = SEPARATOR) -> tuple[list[str], str | None]:
    """Split on `sep` outside parentheses/brackets (without any, a plain split)."""
    if _BRACKETS.search(answer) is None:  # nor then any `sep` holding one
        return [item.strip() for item in answer.split(sep)], None
    return _walk_top_level(answer, sep)


def _walk_top_level(answer: str, sep: str = SEPARATOR) -> tuple[list[str], str | None]:
    """`_split_top_level` character by character, counting the brackets' depth."""
    items, depth, start, i = [], 0, 0, 0
    while i < len(answer):
        ch = answer[i]
        if ch in "([":
            depth += 1
        elif ch in ")]":
            depth -= 1
            if depth < 0:
                return [], f"unbalanced {ch!r} in {_clip(answer)!r}"
        elif depth == 0 and answer.startswith(sep, i):
            items.append(answer[start:i].strip())
            start = i + len(sep)
            i = start
            continue
        i += 1
    if depth != 0:
        return [], f"unbalanced parentheses in {_clip(answer)!r}"
    items.append(answer[start:].strip())
    return items, None


def _clip(text: str, limit: int = 80) -> str:
    return text if len(text) <= limit else text[: limit - 3] + "..."
