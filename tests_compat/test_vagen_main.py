"""VAGEN main's remote-env protocol (tests_compat/vagen_main_client.py, written from VAGEN
main's client) drives the four environments with VAGEN main's stock example configs,
only the address changed, answering in every format each environment defines."""

from __future__ import annotations

import functools
import json
import os
import subprocess
from pathlib import Path

import httpx
import pytest
from conftest import PYTHON, ROOT, TOKEN, oracle_plan
from vagen_main_answers import FORMATS, STOCK, answer
from vagen_main_client import CLIENT_KEYS, RemoteEnv

HERE = Path(__file__).resolve().parent
EPISODES = {"sokoban": 2, "frozenlake": 2, "navigation": 1, "primitive_skill": 1}


@functools.cache
def plan(env: str, seed: int) -> dict:
    config = {k: v for k, v in STOCK[env]["config"].items() if k not in CLIENT_KEYS}
    return oracle_plan(env, seed, config, vagen_main=True)


def remote(server, env: str, **overrides) -> RemoteEnv:
    config = {**STOCK[env]["config"], **overrides}
    return RemoteEnv({"base_urls": f"{server.url}/compat/vagen/{env}", "token": TOKEN, **config})


@pytest.mark.parametrize(
    ("env", "fmt"), [(env, fmt) for env, formats in FORMATS.items() for fmt in formats]
)
def test_stock_config_every_answer_valid_and_rewarded(servers, env, fmt):
    server, _ = servers
    stock = STOCK[env]
    first_seed = stock["seeds"][0]
    for seed in range(first_seed, first_seed + EPISODES[env]):
        expert = plan(env, seed)
        client = remote(server, env, prompt_format=fmt)
        try:
            obs, info = client.reset(seed)
            assert obs["obs_str"].count("<image>") == len(obs["multi_modal_input"]["<image>"]) == 1
            assert info["ground_truth"] == expert["ground_truths"][0]  # the same level
            assert client.system_prompt()["obs_str"]
            truths = expert["ground_truths"]
            turns = list(zip(expert["turns"], truths[:-1], truths[1:], strict=True))
            for actions, before, after in turns[: stock["max_turns"]]:
                obs, reward, done, info = client.step(answer(env, fmt, actions, before, after))
                assert info["metrics"]["turn_metrics"]["action_is_valid"] is True, info
                assert info["ground_truth"] == after  # the same actions were executed
                assert reward > 0  # VAGEN main: the format reward, and success_reward at the end
                assert len(obs["multi_modal_input"]["<image>"]) == 1
                if done:
                    assert info["success"] is True
                    break
        finally:
            client.close()


@pytest.mark.parametrize("env", list(STOCK))
def test_same_seed_same_first_frame(servers, env):
    server, _ = servers
    seed = STOCK[env]["seeds"][0] + 7
    frames = []
    for _ in range(2):
        client = remote(server, env)
        try:
            obs, _ = client.reset(seed)
            frames.append(obs["multi_modal_input"]["<image>"][0].tobytes())
        finally:
            client.close()
    assert frames[0] == frames[1]


def test_what_cannot_be_done_is_refused_naming_the_key(servers):
    server, _ = servers
    client = remote(server, "frozenlake", slip_prob=0.2)
    with pytest.raises(httpx.HTTPStatusError) as caught:
        client.reset(0)
    reply = caught.value.response
    assert reply.status_code == 400
    assert reply.json()["error"]["field"] == "env_config.slip_prob"
    client.close()


def test_verdicts_equal_vagen_mains():
    """VAGEN main's own parsers' verdicts (recorded from its source by
    record_vagen_main_verdicts.py) against ours on the same answers: an answer it takes is
    taken here with the same actions, one it refuses is refused."""
    recorded = json.loads((HERE / "vagen_main_verdicts.json").read_text())
    assert recorded["source"]["commit"].startswith("2936322a")
    cases = recorded["cases"]
    out = subprocess.run(
        [PYTHON, str(HERE / "our_verdicts.py")], input=json.dumps(recorded), cwd=ROOT,
        capture_output=True, text=True, check=True, timeout=300,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )  # fmt: skip
    ours = json.loads(out.stdout)
    assert len(ours) == len(cases) > 200
    differ = [
        (case["env"], case["format"], case["text"], case["vagen"], mine)
        for case, mine in zip(cases, ours, strict=True)
        if case["vagen"]["valid"] != mine["valid"]
        or (mine["valid"] and case["vagen"]["executed"] != mine["executed"])
    ]
    assert differ == []
    assert sum(c["vagen"]["valid"] for c in cases) > 100  # both kinds, plenty of each
    assert sum(not c["vagen"]["valid"] for c in cases) > 100
