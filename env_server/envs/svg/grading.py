"""How the SVG environment grades an agent's `<observation>`/`<prediction>`.

There is no object state to locate (the environment declares `grading = None`), so a
description is graded by the share of the icon description's words it names; the state
prompt asks the agent to describe the picture, with a made-up example.
"""

from __future__ import annotations

import json
import re
from typing import Any

from env_server.core import Representation, StatePrompt

EXAMPLE_DESCRIPTION = "yellow smiling face with two black eyes"  # the prompts' made-up icon
EXAMPLE_SVG = (
    '<svg xmlns="http://www.w3.org/2000/svg" viewBox="0 0 72 72">'
    '<circle cx="36" cy="36" r="23" fill="#FCEA2B" stroke="#000" stroke-width="2"/>'
    '<circle cx="30" cy="31" r="3"/><circle cx="42" cy="31" r="3"/></svg>'
)
STOPWORDS = {"a", "an", "and", "the", "of", "with", "in", "on", "for", "to"}


def words(text: str) -> set[str]:
    """The graded words of a text: lower-case letters and digits, stopwords left out."""
    return set(re.findall(r"[a-z0-9]+", text.lower())) - STOPWORDS


def grade_description(text: str, truth: dict[str, Any]) -> float:
    """The share of the icon description's words that `text` names.

    An icon without a description can't be graded: ValueError, which reasoning/ reports
    as `grading_error` (scores None), rather than a 0 the agent did not earn.
    """
    wanted = words(truth.get("description") or "")
    if not wanted:
        raise ValueError(f"icon {truth.get('icon_id')!r} has no description to grade against")
    return len(wanted & words(text)) / len(wanted)


def state_prompt(representation: Representation) -> StatePrompt:
    """Describe the picture (what `grade_description` rewards), with a made-up example."""
    rep = Representation(representation)
    state = {"icon_id": "example", "description": EXAMPLE_DESCRIPTION}
    texts = {
        Representation.NATURAL: "The picture shows a yellow smiling face with two black eyes.",
        Representation.SYMBOLIC: "face=yellow circle, smiling; eyes=two black dots",
        Representation.STRUCTURED: json.dumps(
            {
                "objects": ["face", "eyes"],
                "colours": ["yellow", "black"],
                "description": "smiling face with two eyes",
            }
        ),
    }
    forms = {
        Representation.NATURAL: "in a sentence",
        Representation.SYMBOLIC: "as 'part=colour shape' entries separated by ';'",
        Representation.STRUCTURED: 'as one JSON object with "objects", "colours" and "description"',
    }
    instruction = (
        "<observation> describes the target picture and <prediction> what your rendering "
        f"will show, {forms[rep]}: name what it depicts, its parts, colours and shapes. "
        "They are graded by how many words of the icon's own description they name."
    )
    text = texts[rep]
    return StatePrompt(
        instruction=instruction,
        reminder=f"{forms[rep]}, naming objects, colours, shapes",
        before=state,
        after=state,
        answer=EXAMPLE_SVG,
        observation=text,
        prediction=text,
    )
