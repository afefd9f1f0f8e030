"""primitive_skill end to end: a real `visenv serve` process, a session over REST, and the
oracle's primitives sent as explicit actions until the task is solved."""

from __future__ import annotations

import httpx
import pytest

from env_server.core import Action
from env_server.envs.primitive_skill import PrimitiveSkillConfig, PrimitiveSkillEnv

pytestmark = [
    pytest.mark.skipif(
        PrimitiveSkillEnv.unavailable_reason() is not None,
        reason=f"primitive_skill unavailable: {PrimitiveSkillEnv.unavailable_reason()}",
    ),
    pytest.mark.filterwarnings("ignore::DeprecationWarning"),
]


def test_e2e_rest_session_solved_by_oracle_primitives(start_visenv_server):
    server = start_visenv_server(workers=1, envs="primitive_skill")
    config = {"task": "PlaceTwoCube"}
    local = PrimitiveSkillEnv(PrimitiveSkillConfig(**config))  # the same seed, side by side
    # a simulator's first episode includes its shader warm-up: allow for it
    with httpx.Client(base_url=server.url, headers=server.headers, timeout=300) as c:
        try:
            envs = {e["name"]: e for e in c.get("/v1/envs").json()["envs"]}
            assert envs["primitive_skill"]["available"] is True
            assert envs["primitive_skill"]["action_space"]["arity"] == {
                "pick": 3,
                "place": 3,
                "push": 6,
            }
            bad = c.post(
                "/v1/sessions", json={"env": "primitive_skill", "config": {"task": "Juggle"}}
            )
            assert bad.status_code == 422 and bad.json()["error"]["code"] == "INVALID_ARGUMENT"

            reply = c.post(
                "/v1/sessions",
                json={
                    "env": "primitive_skill",
                    "config": config,
                    "seed": 11,
                    "format": "free_think",
                },
            )
            assert reply.status_code == 200, reply.text
            reply = reply.json()
            sid = reply["session_id"]
            assert reply["observation"]["images"][0]["shape"] == [300, 300, 3]
            assert "pick(x, y, z)" in reply["system_prompt"]
            truth = reply["observation"]["ground_truth"]
            assert truth == local.reset(11).ground_truth

            # an invalid primitive is a normal reply, not an error
            step = c.post(
                f"/v1/sessions/{sid}/step",
                json={"step_index": 0, "actions": [{"name": "place", "args": [0, 0, 20]}]},
            )
            assert step.status_code == 200, step.text
            step = step.json()
            assert step["info"]["actions_executed"] == 0
            assert "nothing is held" in step["info"]["invalid_actions"][0]
            local.step([Action("place", (0, 0, 20))])

            for step_index in range(1, 6):
                actions = local.oracle_actions()
                local.step(actions)
                body = {"step_index": step_index, "actions": [a.to_json() for a in actions]}
                step = c.post(f"/v1/sessions/{sid}/step", json=body)
                assert step.status_code == 200, step.text
                step = step.json()
                assert step["info"]["actions_executed"] == len(actions)
                if step["terminated"] or step["truncated"]:
                    break
            assert step["success"] and step["terminated"]
            assert step["reward_parts"]["env"] == pytest.approx(10 - 0.1 * 4)
            assert c.get(f"/v1/sessions/{sid}/frame.png").content[:4] == b"\x89PNG"
            assert c.delete(f"/v1/sessions/{sid}").status_code == 200
        finally:
            local.close()
