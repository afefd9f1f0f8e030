"""clients/verl_interaction.py against a real server, at the level of verl's interface
(verl/interactions/base.py: start_interaction, generate_response -> (done, text, score,
extra), calculate_score, finalize_interaction), without verl or a GPU."""

from __future__ import annotations

import asyncio
import inspect

import pytest

from clients.verl_interaction import VisenvInteraction
from env_server.core import Representation, registry


def oracle_response(env, actions) -> str:
    before = env.describe(env.ground_truth(), Representation.NATURAL)
    env.step(actions)
    after = env.describe(env.ground_truth(), Representation.NATURAL)
    answer = ", ".join(a.name for a in actions)
    return (
        f"<think><observation>{before}</observation><reasoning>Plan.</reasoning>"
        f"<prediction>{after}</prediction></think><answer>{answer}</answer>"
    )


def test_interface_is_verls():
    for name, params in {
        "start_interaction": ["instance_id", "kwargs"],
        "generate_response": ["instance_id", "messages", "kwargs"],
        "calculate_score": ["instance_id", "kwargs"],
        "finalize_interaction": ["instance_id", "kwargs"],
    }.items():
        method = getattr(VisenvInteraction, name)
        assert inspect.iscoroutinefunction(method), name
        assert list(inspect.signature(method).parameters)[1:] == params, name
    interaction = VisenvInteraction({"name": "visenv", "servers": "127.0.0.1:1"})
    assert interaction.name == "visenv" and interaction.config["servers"]


def test_a_verl_rollout_plays_an_episode(visenv_server):
    interaction = VisenvInteraction(
        {"name": "visenv", "servers": [visenv_server.url], "transport": "http",
         "env": "sokoban", "format": "grounding_worldmodeling"}
    )  # fmt: skip
    local = registry.make("sokoban")
    local.reset(5)

    async def rollout() -> tuple[list, float, float, str]:
        iid = await interaction.start_interaction(None, seed=5, name="visenv")
        session_id = interaction._episodes[iid].session_id
        system, first = interaction.initial_prompt(iid)
        messages = [{"role": "system", "content": system}, {"role": "user", "content": first}]
        turns = []
        for _ in range(30):
            text = oracle_response(local, local.oracle_actions())
            messages.append({"role": "assistant", "content": [{"type": "text", "text": text}]})
            turn = await interaction.generate_response(iid, messages)
            turns.append(turn)
            messages.append({"role": "user", "content": turn[1]})
            if turn[0]:
                break
        score = await interaction.calculate_score(iid)
        await interaction.finalize_interaction(iid)
        with pytest.raises(KeyError):
            await interaction.generate_response(iid, messages)
        await interaction.client.aclose()
        return turns, score, sum(t[2] for t in turns), session_id

    turns, score, total, session_id = asyncio.run(rollout())
    done, text, reward, extra = turns[-1]
    assert done is True and extra["success"] is True and extra["terminated"] is True
    assert text.count("<image>") == len(extra["images"]) == 1 and extra["images"][0].size[0] > 0
    assert all(isinstance(t[2], float) for t in turns) and score == pytest.approx(total)
    assert extra["reward_parts"]["format"] == 0.5 and extra["info"]["action_valid"]
    with visenv_server.client() as c:  # finalize_interaction closed the session
        assert c.get(f"/v1/sessions/{session_id}").status_code == 404


def test_bad_kwargs_are_refused():
    interaction = VisenvInteraction({"servers": "127.0.0.1:1", "env": "sokoban"})
    with pytest.raises(ValueError, match="colour"):
        asyncio.run(interaction.start_interaction(None, colour="red"))
