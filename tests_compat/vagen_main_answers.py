"""Well-formed answers in VAGEN main's formats, per environment, from an oracle's actions.

The layouts, separators, answer tags and action spellings are VAGEN main's (github.com/
mll-lab-nu/VAGEN, commit 2936322a: vagen/envs/*/utils/{prompt,parse}.py and the envs'
ACTION_LOOKUP); `answer(...)` writes what a model following VAGEN main's prompt would.
"""

from __future__ import annotations

import json
from typing import Any

# the formats each of VAGEN main's environments defines (its parsers' names)
FORMATS = {
    "sokoban": ("wm", "free_think", "free_wm"),
    "frozenlake": ("wm", "free_think"),
    "navigation": ("wm", "free_think", "no_think", "eval_mode"),
    "primitive_skill": ("wm", "free_think"),
}
SEPARATOR = {"sokoban": ",", "frozenlake": ",", "navigation": "|", "primitive_skill": "|"}
ANSWER_TAG = {"navigation": "action"}
# VAGEN main's navigation spells our actions its own way
NAVIGATION_NAMES = {
    "moveahead": "move_forward", "moveback": "move_backward", "moveleft": "move_left",
    "moveright": "move_right", "rotateleft": "turn_left", "rotateright": "turn_right",
    "lookup": "look_up", "lookdown": "look_down",
}  # fmt: skip

# VAGEN main's examples/evaluate/<env>/config.yaml (first entry), only the address changed
STOCK = {
    "sokoban": {
        "max_turns": 5, "seeds": (10000, 10128),
        "config": {"dim_room": [6, 6], "max_steps": 100, "num_boxes": 1,
                   "render_mode": "vision", "max_actions_per_step": 3, "action_sep": ",",
                   "use_example_in_sys_prompt": True, "prompt_format": "wm"},
    },
    "frozenlake": {
        "max_turns": 5, "seeds": (0, 128),
        "config": {"render_mode": "vision", "size": 4, "p": 0.8, "is_slippery": False,
                   "slip_prob": 0.0, "max_actions_per_step": 5},
    },
    "navigation": {
        "max_turns": 10, "seeds": (0, 60),
        "config": {"timeout": 120, "retries": 3, "eval_set": "base",
                   "prompt_format": "eval_mode", "max_actions_per_step": 5},
    },
    "primitive_skill": {
        "max_turns": 5, "seeds": (0, 16),
        "config": {"timeout": 120, "retries": 6, "env_id": "AlignTwoCube",
                   "prompt_format": "wm", "max_actions_per_step": 2, "action_sep": "|",
                   "render_mode": "vision", "format_reward": 0.1, "success_reward": 10.0},
    },
}  # fmt: skip


def action_text(env: str, action: dict[str, Any]) -> str:
    if action.get("args"):
        return f"{action['name']}({', '.join(f'{a:g}' for a in action['args'])})"
    return NAVIGATION_NAMES.get(action["name"], action["name"]) if env == "navigation" else action[
        "name"]  # fmt: skip


def answer(env: str, fmt: str, actions: list[dict], before: Any, after: Any) -> str:
    """A response in VAGEN main's `fmt` for `env` holding `actions`."""
    sep = SEPARATOR[env]
    tag = ANSWER_TAG.get(env, "answer")
    acts = f"<{tag}>{(sep + ' ').join(action_text(env, a) for a in actions)}</{tag}>"
    obs = f"<observation>{json.dumps(before)}</observation>"
    pred = f"<prediction>{json.dumps(after)}</prediction>"
    think = "<think>The target is that way, so I move towards it.</think>"
    return {
        "wm": f"{obs}\n{think}\n{acts}\n{pred}",
        "free_think": f"{think}\n{acts}",
        "free_wm": f"{obs}\nThe target is that way.\n{acts}\nThen:\n{pred}",
        "no_think": acts,
        "eval_mode": f"I will move towards the target.\n{acts}",
    }[fmt]
