"""Measure VAGEN main's stock configs against a running visenv (run with the MAIN venv):

    .venv/bin/python -m visenv_cli serve --port 8000 --token t &
    PYTHONPATH=. .venv/bin/python tests_compat/measure_vagen_main.py http://127.0.0.1:8000 t

Per stock config (VAGEN main's examples/evaluate/<env>/config.yaml, first entry, only the
address changed): whether it connects, valid answers / answers sent, and the mean episode
return of a scripted oracle answering in VAGEN main's `wm` layout for at most the
config's max_turns, through VAGEN main's protocol (vagen_main_client.py); then the same
oracle through our own SDK (clients.EnvClient over HTTP) with format `vagen_wm`, the same
action separator and otherwise our default reasoning options (so our rewards: format 0.5, graded <observation> and
<prediction>, env rewards). The oracle is a local copy of the environment, its
observation and prediction our natural descriptions of the true states.
"""

from __future__ import annotations

import json
import statistics
import sys

import httpx

from clients import EnvClient, SessionOptions
from env_server.api.compat.vagen_config import main_session_options
from env_server.core import Representation, registry

sys.path.insert(0, __file__.rsplit("/", 1)[0])
from vagen_main_answers import ANSWER_TAG, SEPARATOR, STOCK, action_text  # noqa: E402
from vagen_main_client import CLIENT_KEYS, RemoteEnv  # noqa: E402

EPISODES = {"sokoban": 16, "frozenlake": 16, "navigation": 4, "primitive_skill": 2}


def wm(env: str, actions, before: str, after: str, tag: str, sep: str) -> str:
    acts = [a.to_json() for a in actions]
    answer = f"{sep} ".join(action_text(env, a) for a in acts)
    return (
        f"<observation>{before}</observation>\n<think>I move towards the goal.</think>\n"
        f"<{tag}>{answer}</{tag}>\n<prediction>{after}</prediction>"
    )


def oracle_turns(env: str, config: dict, seed: int, turns: int):
    """(actions, description before, description after) of the oracle's first turns."""
    local = registry.make(env, config)
    local.reset(seed)
    out = []
    for _ in range(turns):
        before = local.describe(local.ground_truth(), Representation.NATURAL)
        actions = local.oracle_actions()
        transition = local.step(actions)
        out.append((actions, before, local.describe(local.ground_truth(), Representation.NATURAL)))
        if transition.terminated or transition.truncated:
            break
    local.close()
    return out


def measure(url: str, token: str, env: str) -> dict:
    stock = STOCK[env]
    remote_config = {k: v for k, v in stock["config"].items() if k not in CLIENT_KEYS}
    fields = set(type(registry.make_config(env, {})).model_fields)
    ours = main_session_options(env, remote_config, fields)["config"]
    tag, sep = ANSWER_TAG.get(env, "answer"), SEPARATOR[env]
    row = {"env": env, "connects": True, "valid": 0, "sent": 0, "returns": [], "successes": 0}
    sdk = {"valid": 0, "sent": 0, "returns": [], "successes": 0}
    seeds = range(stock["seeds"][0], stock["seeds"][0] + EPISODES[env])
    with EnvClient([url], transport="http", token=token) as client:
        for seed in seeds:
            plan = oracle_turns(env, ours, seed, stock["max_turns"])
            remote = RemoteEnv({"base_urls": f"{url}/compat/vagen/{env}", "token": token,
                                **stock["config"]})  # fmt: skip
            try:
                remote.reset(seed)
            except httpx.HTTPError as exc:
                row["connects"] = f"no: {exc}"
                break
            total, success = 0.0, False
            for actions, before, after in plan:
                _, reward, done, info = remote.step(wm(env, actions, before, after, tag, sep))
                row["sent"] += 1
                row["valid"] += bool(info["metrics"]["turn_metrics"]["action_is_valid"])
                total += reward
                success = bool(info.get("success"))
                if done:
                    break
            remote.close()
            row["returns"].append(total)
            row["successes"] += success
            # our SDK, format vagen_wm, our reasoning defaults
            options = SessionOptions(env, config=ours, seed=seed, format="vagen_wm",
                                     reasoning={"action_sep": sep})  # fmt: skip
            created = client.create([options])
            sid = created[0].session_id
            total, success = 0.0, False
            for actions, before, after in plan:
                reply = client.step([sid], [wm(env, actions, before, after, "answer", sep)])[0]
                sdk["sent"] += 1
                sdk["valid"] += bool(reply.info.get("action_valid"))
                total += reply.reward
                success = reply.success
                if reply.terminated or reply.truncated:
                    break
            client.close([sid])
            sdk["returns"].append(total)
            sdk["successes"] += success
    for r in (row, sdk):
        r["mean_return"] = round(statistics.fmean(r["returns"]), 4) if r["returns"] else None
        r["episodes"] = len(r.pop("returns"))
    row["sdk_vagen_wm"] = sdk
    return row


if __name__ == "__main__":
    url, token = sys.argv[1], sys.argv[2]
    envs = sys.argv[3:] or list(STOCK)
    for env in envs:
        print(json.dumps(measure(url, token, env)), flush=True)
