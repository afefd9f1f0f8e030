"""System and per-turn prompts for the response formats.

`system_prompt(env, fmt, rep, cfg)` = the environment's own prompt (`env.system_prompt(fmt)`:
rules, actions) + how to lay out a response in `fmt` + how to write states in
`rep` (for formats with `<observation>` / `<prediction>`) + one example response (unless
`cfg.prompt_example` is false). `cfg` (the session's ReasoningConfig) also gives the action
separator and, for VAGEN main's formats, the answer tag.

The example's state is made up (never the current episode's state), written from the
environment's `GradingSpec`: a small room with its object types placed around the
anchor, in the session's representation, so the example shows the exact words,
grid symbols or JSON keys the grader reads.

An environment whose states are not grid positions (navigation's egocentric metres,
primitive_skill's millimetres, svg's picture) gives its own instruction and example
through `Environment.state_prompt(rep)`; then those are used instead.
"""

from __future__ import annotations

import json

from env_server.core.env import Environment, StatePrompt
from env_server.core.spatial import GradingSpec, grid_relation, relation_phrase
from env_server.core.types import (
    ActionKind,
    ActionSpace,
    Observation,
    Representation,
    ResponseFormat,
)

from .config import ReasoningConfig
from .formats import DEFAULTS, SECTIONS, VAGEN_LAYOUTS, layout, state_sections
from .grading import grading_spec

_DESCRIPTION = {
    ResponseFormat.NO_THINK: "Give only your answer, with no reasoning.",
    ResponseFormat.FREE_THINK: "First think it through inside <think>, then give your answer.",
    ResponseFormat.GROUNDING: (
        "Inside <think>, first describe what you see now in <observation>, then reason about "
        "what to do in <reasoning>; then give your answer."
    ),
    ResponseFormat.WORLDMODELING: (
        "Inside <think>, first reason about what to do in <reasoning>, then say in <prediction> "
        "what the state will be once your actions are done; then give your answer."
    ),
    ResponseFormat.GROUNDING_WORLDMODELING: (
        "Inside <think>, first describe what you see now in <observation>, then reason about "
        "what to do in <reasoning>, then say in <prediction> what the state will be once your "
        "actions are done; then give your answer."
    ),
    ResponseFormat.VAGEN_FREE_THINK: "First think it through inside <think>, then give your answer.",
    ResponseFormat.VAGEN_WM: (
        "First describe what you see now in <observation>, then think it through in <think>, "
        "give your answer, and then say in <prediction> what the state will be once your "
        "actions are done."
    ),
    ResponseFormat.VAGEN_FREE_WM: (
        "First describe what you see now in <observation>, reason freely, give your answer, "
        "and then say in <prediction> what the state will be once your actions are done."
    ),
    ResponseFormat.VAGEN_NO_THINK: "Give only your answer, with no reasoning.",
    ResponseFormat.VAGEN_EVAL_MODE: "You may reason as you like; then give your answer.",
}


def system_prompt(
    env: Environment,
    fmt: ResponseFormat | str,
    rep: Representation | str,
    cfg: ReasoningConfig | None = None,
) -> str:
    """The full system prompt of a session."""
    fmt, rep, cfg = ResponseFormat(fmt), Representation(rep), cfg or DEFAULTS
    space = env.action_space
    spec = grading_spec(env)
    parts = [env.system_prompt(fmt).strip(), "", "Response format:"]
    parts += [_answer_rule(space, cfg.action_sep, fmt in VAGEN_LAYOUTS), _DESCRIPTION[fmt]]
    if _describes_state(fmt):
        own = env.state_prompt(rep)
        parts.append(own.instruction if own is not None else _representation_rule(spec, rep))
    if fmt in VAGEN_LAYOUTS:
        parts.append(f"Your response must hold: {layout(fmt, cfg.answer_tag)}")
    else:
        parts += [f"Your response must be exactly: {layout(fmt)}", "No text outside these tags."]
    if cfg.prompt_example:
        parts.append("Example response:\n" + example_response(env, fmt, rep, cfg))
    return "\n".join(parts)


def turn_prompt(
    env: Environment,
    obs: Observation,
    fmt: ResponseFormat | str,
    rep: Representation | str,
    cfg: ReasoningConfig | None = None,
) -> str:
    """The text shown with each observation: the observation text and a short reminder."""
    fmt, rep, cfg = ResponseFormat(fmt), Representation(rep), cfg or DEFAULTS
    space = env.action_space
    reminder = f"Respond as {layout(fmt, cfg.answer_tag)}"
    if _describes_state(fmt):
        own = env.state_prompt(rep)
        if own is not None:
            reminder += f", states written {own.reminder}"
        elif rep is not Representation.NATURAL:
            reminder += f", states written {_REP_SHORT[rep]}"
    if space.kind is ActionKind.DOCUMENT:
        # the env's own words for it (vicrit's answer is a span of the caption, not a file)
        what = space.description or "One document."
        reminder += f"; answer with {what[0].lower()}{what[1:]}"
    else:
        reminder += f"; at most {space.max_per_turn} action(s), separated by '{cfg.action_sep}'."
    return f"{obs.text.rstrip()}\n{reminder}"


_REP_SHORT = {
    Representation.NATURAL: "as sentences",
    Representation.SYMBOLIC: "as a grid of symbols",
    Representation.STRUCTURED: "as a JSON object",
}


def _describes_state(fmt: ResponseFormat) -> bool:
    return bool(state_sections(fmt))


def _answer_rule(space: ActionSpace, sep: str, vagen: bool = False) -> str:
    if space.kind is ActionKind.DOCUMENT:
        return "Your answer is one whole document (it may be in a ``` code block)."
    if space.kind is ActionKind.CALL:
        calls = ", ".join(f"{n}({', '.join(['n'] * space.arity.get(n, 0))})" for n in space.names)
        return (
            f"Your answer holds up to {space.max_per_turn} action(s) separated by '{sep}'; "
            f"each is a call with numbers: {calls}."
        )
    return (
        f"Your answer holds up to {space.max_per_turn} action(s) separated by '{sep}', "
        f"chosen from: {', '.join(space.vagen_name(n) if vagen else n for n in space.names)}."
    )


def _representation_rule(spec: GradingSpec, rep: Representation) -> str:
    where = "<observation> and <prediction> describe"
    if rep is Representation.SYMBOLIC:
        legend = " | ".join(
            f"{s} {' on '.join(t) if t else 'empty'}" for s, t in spec.symbols.items()
        )
        return f"{where} the state as a grid, one line per row, with the symbols: {legend}."
    if rep is Representation.STRUCTURED:
        return (
            f"{where} the state as one JSON object mapping each object type to its "
            "[row, column] position, or to a list of positions when there can be several."
        )
    return (
        f"{where} the state in sentences giving where each object is relative to the "
        f"{spec.anchor}, using both directions for diagonals (e.g. 'The box is below and "
        f"to the right of the {spec.anchor}.')."
    )


# ---- the example -----------------------------------------------------------------


def _example_states(spec: GradingSpec) -> tuple[dict, dict, int]:
    """A made-up state before and after one move, from the spec's object types."""
    types = [t for t in dict.fromkeys(t for ts in spec.symbols.values() for t in ts)]
    types = [t for t in types if t not in spec.ignore and t != spec.anchor][:3]
    if not types:
        types = ["target"]
    cells = [[1, 3], [3, 1], [3, 3]]
    before: dict = {spec.anchor: [2, 2]}
    for t, cell in zip(types, cells, strict=False):
        before[t] = [cell]
    after = dict(before)
    after[spec.anchor] = [1, 2]  # the anchor moved up one row
    return before, after, 5


def _write_state(state: dict, spec: GradingSpec, rep: Representation, size: int) -> str:
    anchor = state[spec.anchor]
    if rep is Representation.STRUCTURED:
        return json.dumps(state)
    if rep is Representation.NATURAL:
        return " ".join(
            f"The {t.replace('_', ' ')} is {relation_phrase(*grid_relation(anchor, p))} the "
            f"{spec.anchor}."
            for t, ps in state.items()
            if t != spec.anchor
            for p in ps
        )
    by_types = {tuple(ts): s for s, ts in spec.symbols.items()}
    floor = by_types.get((), "_")
    wall = next((s for s, ts in spec.symbols.items() if "wall" in ts), None)
    grid = [[floor] * size for _ in range(size)]
    if wall is not None:
        for i in range(size):
            grid[0][i] = grid[-1][i] = grid[i][0] = grid[i][-1] = wall
    for t, ps in state.items():
        for p in [ps] if t == spec.anchor else ps:
            grid[p[0]][p[1]] = by_types.get((t,), grid[p[0]][p[1]])
    return "\n".join("".join(row) for row in grid)


def _example_answer(space: ActionSpace) -> str:
    if space.kind is ActionKind.DOCUMENT:
        return '<svg xmlns="http://www.w3.org/2000/svg" width="64" height="64"></svg>'
    if space.kind is ActionKind.CALL:
        name = space.names[0]
        return f"{name}({', '.join(['0'] * space.arity.get(name, 0))})"
    # the anchor moves up one row in the example states; use "Up" when there is one
    up = space.lookup("up") or space.lookup("moveahead") or space.names[0]
    return up


def example_response(
    env: Environment, fmt: ResponseFormat, rep: Representation, cfg: ReasoningConfig | None = None
) -> str:
    """A well-formed example response in `fmt`, its states written in `rep`."""
    cfg = cfg or DEFAULTS
    space = env.action_space
    spec = grading_spec(env)
    own: StatePrompt | None = env.state_prompt(rep)
    answer = own.answer if own is not None else _example_answer(space)
    if fmt in VAGEN_LAYOUTS:
        return _vagen_example(env, fmt, rep, cfg, answer)
    sections = SECTIONS[fmt]
    if sections == ():
        return f"<answer>{answer}</answer>"
    if sections is None:
        return (
            f"<think>I look at the scene and decide on {answer}.</think><answer>{answer}</answer>"
        )
    if own is not None:
        text = {
            "observation": own.observation,
            "reasoning": f"Given what I see, {answer if len(answer) <= 60 else 'this answer'} "
            "is the best next step.",
            "prediction": own.prediction,
        }
        inner = "".join(f"<{s}>{text[s]}</{s}>" for s in sections)
        return f"<think>{inner}</think><answer>{answer}</answer>"
    state_ok = bool(spec.symbols) or rep is not Representation.SYMBOLIC
    before, after, size = _example_states(spec)
    text = {
        "observation": _write_state(before, spec, rep, size) if state_ok else "...",
        "reasoning": f"Given what I see, {answer} is the best next step.",
        "prediction": _write_state(after, spec, rep, size) if state_ok else "...",
    }
    inner = "".join(f"<{s}>{text[s]}</{s}>" for s in sections)
    return f"<think>{inner}</think><answer>{answer}</answer>"


def _vagen_example(
    env: Environment, fmt: ResponseFormat, rep: Representation, cfg: ReasoningConfig, answer: str
) -> str:
    """An example in one of VAGEN main's layouts, with the paper formats' made-up states."""
    own = env.state_prompt(rep)
    if own is not None:
        states = {"observation": own.observation, "prediction": own.prediction}
    else:
        spec = grading_spec(env)
        state_ok = bool(spec.symbols) or rep is not Representation.SYMBOLIC
        before, after, size = _example_states(spec)
        states = {
            "observation": _write_state(before, spec, rep, size) if state_ok else "...",
            "prediction": _write_state(after, spec, rep, size) if state_ok else "...",
        }
    space = env.action_space
    if space.kind is ActionKind.DISCRETE:
        names = (space.vagen_name(space.lookup(a) or a.strip()) for a in answer.split(","))
        answer = cfg.action_sep.join(names)
    short = answer if len(answer) <= 60 else "this answer"
    text = {
        **states,
        "think": f"Given what I see, {short} is the best next step.",
        "answer": answer,
    }
    layout_ = VAGEN_LAYOUTS[fmt]
    pieces = [
        f"<{tag}>{text[name]}</{tag}>"
        for name in layout_.tags
        for tag in [cfg.answer_tag if name == "answer" else name]
    ]
    if layout_.free_between:  # free reasoning before the answer
        return f"{pieces[0]}\n{text['think']}\n" + "\n".join(pieces[1:])
    return "\n".join(pieces)
