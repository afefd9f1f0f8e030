"""Run with the MAIN venv: an expert's whole episode for `env` at `seed`, as JSON.

    .venv/bin/python tests_compat/oracle_plan.py sokoban 3 '{"dim_room": [6, 6]}'
    -> {"turns": [[{"name": "Left", "args": [], "payload": null}, ...], ...],
        "ground_truths": [<after reset>, <after turn 1>, ...], "success": true}

The compat tests (in a venv without visenv) play these turns through OpenEnv's client
and check the server's ground truth after each one (same seed, same level). A fourth
argument `vagen_main` reads the config as VAGEN main's env_config (as /compat/vagen does).
"""

from __future__ import annotations

import json
import sys

from env_server.core import registry


def main(env_name: str, seed: int, config: dict) -> dict:
    env = registry.make(env_name, config)
    env.reset(seed)
    turns, truths, success = [], [env.ground_truth()], False
    for _ in range(60):
        actions = env.oracle_actions()
        transition = env.step(actions)
        turns.append([a.to_json() for a in actions])
        truths.append(env.ground_truth())
        success = transition.success
        if transition.terminated or transition.truncated:
            break
    return {"turns": turns, "ground_truths": truths, "success": success}


if __name__ == "__main__":
    config = json.loads(sys.argv[3]) if len(sys.argv) > 3 else {}
    if sys.argv[4:] == ["vagen_main"]:
        from env_server.api.compat.vagen_config import main_session_options

        fields = set(type(registry.make_config(sys.argv[1], {})).model_fields)
        config = main_session_options(sys.argv[1], config, fields)["config"]
    json.dump(main(sys.argv[1], int(sys.argv[2]), config), sys.stdout)
