"""OpenEnv's own client (`openenv` from PyPI, GenericEnvClient) drives every visenv
environment through a real server's /compat/openenv/{env}/ws."""

from __future__ import annotations

import asyncio
import base64
import json

import httpx
import pytest
import websockets
from conftest import TOKEN, oracle_plan
from openenv.core.generic_client import GenericEnvClient

AUTH = {"Authorization": f"Bearer {TOKEN}"}
PNG = b"\x89PNG\r\n\x1a\n"
CIRCLE = (
    '<svg xmlns="http://www.w3.org/2000/svg" width="64" height="64">'
    '<circle cx="32" cy="32" r="20" fill="#f5a623"/></svg>'
)


def client(server, env: str, headers: dict | None = AUTH):
    base = f"{server.url}/compat/openenv/{env}"
    return GenericEnvClient(base_url=base, headers=headers, message_timeout_s=300).sync()


def check_observation(obs: dict, env: str) -> None:
    assert obs["env"] == env and obs["session_id"].startswith("s-")
    assert obs["text"].count("<image>") == len(obs["images"]) >= 1
    assert all(base64.b64decode(image).startswith(PNG) for image in obs["images"])
    assert obs["system_prompt"] and isinstance(obs["ground_truth"], dict)


@pytest.mark.parametrize(("env", "seed"), [("sokoban", 11), ("frozenlake", 7)])
def test_episode_to_the_end_with_the_oracle(servers, env, seed):
    server, _ = servers
    plan = oracle_plan(env, seed)
    assert plan["success"] and len(plan["turns"]) >= 1
    before = server.sessions()
    with client(server, env) as c:
        result = c.reset(seed=seed)
        assert result.done is False
        check_observation(result.observation, env)
        assert result.observation["ground_truth"] == plan["ground_truths"][0]
        assert server.sessions() == before + 1
        gauge = [m for m in server.metrics().splitlines() if m.startswith("visenv_sessions ")]
        assert float(gauge[0].split()[1]) == before + 1  # an ordinary session in /metrics
        truths = plan["ground_truths"][1:]
        for turn, (actions, truth) in enumerate(zip(plan["turns"], truths, strict=True)):
            result = c.step({"actions": actions})
            assert result.observation["turn"] == turn + 1
            assert result.observation["ground_truth"] == truth
            assert isinstance(result.reward, float)
        assert result.done is True and result.reward > 0
        state = c.state()
        assert state["step_count"] == len(plan["turns"]) and state["success"] is True
        assert state["episode_id"] == f"{state['session_id']}/0"
        # a new episode on the same connection and session, then a raw-text turn
        again = c.reset(seed=seed + 1)
        assert again.observation["session_id"] == result.observation["session_id"]
        assert again.observation["episode"] == 1
        text = c.step({"response": "I am not following the format"})
        assert text.done is False and text.observation["turn"] == 1
        with pytest.raises(RuntimeError, match="VALIDATION_ERROR"):
            c.step({"move": "Up"})
        # other options: a new session of that configuration
        other = c.reset(seed=1, format="free_think", config={"max_turns": 3})
        assert other.observation["session_id"] != result.observation["session_id"]
        assert "<think>" in other.observation["system_prompt"]
    assert server.sessions() == before  # closed with the connection


HEAVY = {
    "navigation": lambda gt: {"actions": ["rotateleft"]},
    "primitive_skill": lambda gt: {
        "actions": [{"name": "pick", "args": next(iter(gt["objects"].values()))}]
    },
    "svg": lambda gt: {"actions": [{"name": "svg", "payload": CIRCLE}]},
}


@pytest.mark.parametrize("env", sorted(HEAVY))
def test_heavy_env_reset_step_state_close(servers, env):
    server, _ = servers
    before = server.sessions()
    with client(server, env) as c:
        result = c.reset(seed=0)
        check_observation(result.observation, env)
        step = c.step(HEAVY[env](result.observation["ground_truth"]))
        assert step.observation["turn"] == 1 and isinstance(step.reward, float)
        assert step.observation["images"] and step.observation["images"][0]
        assert c.state()["step_count"] == 1
    assert server.sessions() == before


def test_auth_is_checked_at_the_handshake(servers):
    server, _ = servers
    for headers in (None, {"Authorization": "Bearer wrong"}):
        with pytest.raises(ConnectionError, match="401"):
            with client(server, "sokoban", headers) as c:
                c.reset()
    # health is open, schema and metadata need the token
    base = f"{server.url}/compat/openenv/sokoban"
    assert httpx.get(base + "/health").json()["status"] == "healthy"
    assert httpx.get(base + "/schema").status_code == 401
    schema = httpx.get(base + "/schema", headers=AUTH).json()
    assert {"action", "observation", "state"} <= set(schema)
    assert "response" in schema["action"]["properties"]
    meta = httpx.get(base + "/metadata", headers=AUTH).json()
    assert meta["name"] == "sokoban" and meta["action_space"]["names"]
    assert httpx.get(f"{server.url}/compat/openenv/nope/health").status_code == 404


def test_capacity_is_refused_cleanly(servers):
    _, small = servers  # a cap of one session
    with client(small, "sokoban") as first:
        first.reset(seed=1)
        with client(small, "sokoban") as second:
            with pytest.raises(RuntimeError, match="CAPACITY_REACHED"):
                second.reset(seed=2)
            assert first.step({"actions": ["Up"]}).observation["turn"] == 1  # unharmed
            first.close()
            assert second.reset(seed=2).observation["episode"] == 0  # room again
    assert small.sessions() == 0


def test_protocol_errors_keep_the_connection(servers):
    server, _ = servers
    url = f"{server.url.replace('http', 'ws')}/compat/openenv/frozenlake/ws"

    async def talk() -> list[dict]:
        async with websockets.connect(url, additional_headers=AUTH) as ws:
            replies = []
            for message in ("{nope", json.dumps({"type": "jump"}),
                            json.dumps({"type": "reset", "data": {"seed": "x"}}),
                            json.dumps({"type": "reset", "data": {"seed": 2}})):  # fmt: skip
                await ws.send(message)
                replies.append(json.loads(await ws.recv()))
            await ws.send(json.dumps({"type": "close"}))
            return replies

    replies = asyncio.run(talk())
    assert [r["data"].get("code") for r in replies[:3]] == [
        "INVALID_JSON", "UNKNOWN_TYPE", "VALIDATION_ERROR",
    ]  # fmt: skip
    assert replies[2]["data"]["field"] == "seed"
    assert replies[3]["type"] == "observation" and replies[3]["data"]["done"] is False
    assert "reward_parts" in replies[3]["data"]["metadata"]
