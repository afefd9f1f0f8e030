"""Run with the MAIN venv: visenv's verdicts on VAGEN main's answer corpus, as JSON.

    .venv/bin/python tests_compat/our_verdicts.py < tests_compat/vagen_main_verdicts.json
    -> [{"valid": true, "executed": [["left", []], ...]}, ...]   (one per case)

Each case is parsed as /compat/vagen/{env} would parse it (the session options of VAGEN
main's env_config {"prompt_format", "action_sep", "max_actions_per_step"}), and the
actions are written in VAGEN main's spelling (lower case; navigation's own names).
"""

from __future__ import annotations

import json
import sys

from env_server.api.compat.vagen_config import main_session_options
from env_server.core import registry
from env_server.reasoning import ReasoningConfig, parse_response

VAGEN_NAMES = {
    "moveahead": "move_forward", "moveback": "move_backward", "moveleft": "move_left",
    "moveright": "move_right", "rotateleft": "turn_left", "rotateright": "turn_right",
    "lookup": "look_up", "lookdown": "look_down",
}  # fmt: skip


def verdict(case: dict) -> dict:
    env = case["env"]
    cls = registry.load(env)
    fields = set(cls.Config.model_fields)
    config = {"prompt_format": case["format"], "action_sep": case["action_sep"]}
    if env != "primitive_skill":  # two primitives a turn there, fixed
        config["max_actions_per_step"] = case["max_actions"]
    options = main_session_options(env, config, fields)
    space = cls.action_space_for(cls.Config.model_validate(options["config"]))
    reasoning = ReasoningConfig.model_validate(options["reasoning"])
    parsed = parse_response(case["text"], options["format"], space, reasoning)
    executed = [[VAGEN_NAMES.get(a.name, a.name.lower()), list(a.args)] for a in parsed.actions]
    return {"valid": parsed.format_ok, "executed": executed, "error": parsed.error}


if __name__ == "__main__":
    json.dump([verdict(case) for case in json.load(sys.stdin)["cases"]], sys.stdout)
