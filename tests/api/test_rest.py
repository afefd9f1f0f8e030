"""End to end over REST against a real `visenv serve` process (tests/conftest.py)."""

from __future__ import annotations

import base64
import io
import os
import signal
import time

import numpy as np
import pytest
from PIL import Image

from env_server.core import Representation, registry
from env_server.service.session_ids import origin_of

SOKOBAN = {"env": "sokoban", "seed": 3, "format": "grounding_worldmodeling"}


def decode(image: dict) -> np.ndarray:
    data = base64.b64decode(image["data"])
    if image["encoding"] == "raw":
        return np.frombuffer(data, np.uint8).reshape(image["shape"])
    return np.asarray(Image.open(io.BytesIO(data)).convert("RGB"))


def oracle_response(env, actions) -> str:
    """A well-formed grounding_worldmodeling response describing `env` before and after."""
    before = env.describe(env.ground_truth(), Representation.NATURAL)
    env.step(actions)
    after = env.describe(env.ground_truth(), Representation.NATURAL)
    answer = ", ".join(a.name for a in actions)
    return (
        f"<think><observation>{before}</observation><reasoning>Follow the plan.</reasoning>"
        f"<prediction>{after}</prediction></think><answer>{answer}</answer>"
    )


def test_health_envs_docs_play_metrics(visenv_server):
    with visenv_server.client() as c:
        health = c.get("/health").json()
        assert health["status"] == "ok" and len(health["workers"]) == 2
        assert all(w["alive"] and w["pid"] for w in health["workers"])
        envs = {e["name"]: e for e in c.get("/v1/envs").json()["envs"]}
        assert envs["sokoban"]["available"] and envs["sokoban"]["action_space"]["names"] == [
            "Up", "Down", "Left", "Right",
        ]  # fmt: skip
        assert "properties" in envs["sokoban"]["config_schema"]
        assert c.get("/docs").status_code == 200
        openapi = c.get("/openapi.json").json()
        assert "/v1/batch/step" in openapi["paths"]
        assert "reward_parts" in openapi["components"]["schemas"]["SessionReply"]["properties"]
        play = c.get("/play")
        assert play.status_code == 200 and "play.js" in play.text
        assert c.get("/static/play.js").status_code == 200
        assert "visenv_sessions" in c.get("/metrics").text


def test_oracle_episode_with_actions_reaches_success(visenv_server):
    local = registry.make("sokoban")
    local.reset(SOKOBAN["seed"])
    with visenv_server.client() as c:
        reply = c.post("/v1/sessions", json=SOKOBAN).json()
        sid = reply["session_id"]
        assert origin_of(sid) is not None  # names this server (node, boot)
        assert reply["step_index"] == 0 and reply["reward"] == 0 and reply["system_prompt"]
        assert reply["observation"]["ground_truth"] == local.ground_truth()
        for _ in range(30):
            actions = local.oracle_actions()
            local.step(actions)
            body = {"step_index": reply["step_index"], "actions": [a.to_json() for a in actions]}
            reply = c.post(f"/v1/sessions/{sid}/step", json=body).json()
            assert reply["info"]["action_valid"], reply["info"]
            assert reply["reward_parts"]["format"] == 0  # explicit actions earn no format reward
            assert reply["observation"]["ground_truth"] == local.ground_truth()
            if reply["terminated"]:
                break
        assert reply["success"] and reply["terminated"]
        assert reply["reward_parts"]["env"] > 9  # the solved bonus
        again = c.post(f"/v1/sessions/{sid}/step", json={"step_index": reply["step_index"],
                                                         "actions": [{"name": "Up"}]})  # fmt: skip
        assert again.status_code == 409 and again.json()["error"]["code"] == "FAILED_PRECONDITION"
        assert c.delete(f"/v1/sessions/{sid}").json() == {"ok": True}


def test_oracle_response_earns_format_and_world_model_reward(visenv_server):
    local = registry.make("sokoban")
    local.reset(SOKOBAN["seed"])
    with visenv_server.client() as c:
        reply = c.post("/v1/sessions", json=SOKOBAN).json()
        sid = reply["session_id"]
        for _ in range(30):
            response = oracle_response(local, local.oracle_actions())
            reply = c.post(
                f"/v1/sessions/{sid}/step",
                json={"step_index": reply["step_index"], "response": response},
            ).json()
            info, parts = reply["info"], reply["reward_parts"]
            assert info["action_valid"] and info["parse_error"] is None, info
            assert parts["format"] == 0.5
            assert info["observation_score"] == 1.0 and info["prediction_score"] == 1.0
            assert parts["observation"] == 0.5 and parts["prediction"] == 0.5
            assert reply["reward"] == pytest.approx(sum(parts.values()))
            if reply["terminated"]:
                break
        assert reply["success"]
        # a malformed response is a normal reply: invalid, with the parse error, no format reward
        c.post(f"/v1/sessions/{sid}/reset", json={"seed": 4})
        bad = c.post(f"/v1/sessions/{sid}/step", json={"step_index": 0, "response": "go left"})
        assert bad.status_code == 200
        bad = bad.json()
        assert not bad["info"]["action_valid"] and bad["info"]["parse_error"]
        assert bad["reward_parts"]["format"] == 0 and bad["reward_parts"]["observation"] == 0
        c.delete(f"/v1/sessions/{sid}")


def test_step_index_retry_is_applied_once(visenv_server):
    with visenv_server.client() as c:
        sid = c.post("/v1/sessions", json={"env": "tiny", "seed": 0}).json()["session_id"]
        body = {"step_index": 0, "actions": [{"name": "Right"}]}
        first = c.post(f"/v1/sessions/{sid}/step", json=body).json()
        retry = c.post(f"/v1/sessions/{sid}/step", json=body).json()
        assert retry == first and first["step_index"] == 1
        assert first["observation"]["ground_truth"]["player"] == [0, 1]  # moved once, not twice
        assert c.get(f"/v1/sessions/{sid}").json()["observation"]["ground_truth"]["player"] == [
            0,
            1,
        ]
        ahead = c.post(f"/v1/sessions/{sid}/step", json={**body, "step_index": 5})
        assert ahead.status_code == 409
        assert ahead.json()["error"] == {
            "code": "FAILED_PRECONDITION",
            "message": f"step_index 5 is not the next step of {sid}: expected 1",
            "field": "step_index",
        }
        reset = c.post(f"/v1/sessions/{sid}/reset").json()  # no body: the next seed
        assert reset["step_index"] == 0 and reset["episode"] == 1
        assert reset["observation"]["ground_truth"]["player"] == [0, 1]  # seed 1
        c.delete(f"/v1/sessions/{sid}")


def test_batch_endpoints_answer_per_item(visenv_server):
    with visenv_server.client() as c:
        created = c.post("/v1/batch/create", json={"items": [
            {"env": "sokoban", "seed": 1},
            {"env": "no_such_env"},
            {"env": "sokoban", "config": {"num_boxes": 99}},
            {"env": "frozenlake", "seed": 2, "image_encoding": "raw"},
        ]}).json()["results"]  # fmt: skip
        assert [r["ok"] for r in created] == [True, False, False, True]
        assert created[1]["error"]["code"] == "NOT_FOUND"
        assert created[2]["error"] == {
            "code": "INVALID_ARGUMENT",
            "message": created[2]["error"]["message"],
            "field": "config.num_boxes",
        }
        image = created[3]["reply"]["observation"]["images"][0]
        assert image["encoding"] == "raw" and decode(image).shape == tuple(image["shape"])
        ids = [created[0]["reply"]["session_id"], created[3]["reply"]["session_id"]]
        stepped = c.post("/v1/batch/step", json={"items": [
            {"session_id": ids[0], "step_index": 0, "actions": [{"name": "Left"}]},
            {"session_id": "s-0000000000000000", "step_index": 0, "actions": [{"name": "Up"}]},
            {"session_id": ids[1], "step_index": 0, "response": "<answer>Down</answer>"},
            {"session_id": ids[1], "step_index": 0},
        ]}).json()["results"]  # fmt: skip
        assert [r["ok"] for r in stepped] == [True, False, True, False]
        assert stepped[1]["error"]["code"] == "NOT_FOUND"
        assert stepped[3]["error"]["code"] == "INVALID_ARGUMENT"
        assert stepped[0]["reply"]["step_index"] == 1 and stepped[2]["reply"]["step_index"] == 1
        reset = c.post("/v1/batch/reset", json={"items": [
            {"session_id": ids[0], "seed": 9}, {"session_id": ids[1], "seed": "x"},
        ]}).json()["results"]  # fmt: skip
        assert reset[0]["ok"] and reset[0]["reply"]["step_index"] == 0
        assert (
            reset[1]["error"]["code"] == "INVALID_ARGUMENT" and reset[1]["error"]["field"] == "seed"
        )
        closed = c.post("/v1/batch/close", json={"session_ids": [*ids, ids[0]]}).json()
        assert [r["ok"] for r in closed["results"]] == [True, True, False]
        assert closed["results"][2]["error"]["code"] == "NOT_FOUND"


def test_error_paths_404_422_413(visenv_server):
    with visenv_server.client() as c:
        missing = c.get("/v1/sessions/s-0123456789abcdef")
        assert missing.status_code == 404 and missing.json()["error"]["code"] == "NOT_FOUND"
        assert c.get("/v1/sessions/s-0123456789abcdef/frame.png").status_code == 404
        assert c.delete("/v1/sessions/s-0123456789abcdef").status_code == 404
        unknown = c.post("/v1/sessions", json={"env": "chess"})
        assert unknown.status_code == 404 and unknown.json()["error"]["field"] == "env"
        bad_format = c.post("/v1/sessions", json={"env": "sokoban", "format": "poetry"})
        assert bad_format.status_code == 422
        assert bad_format.json()["error"]["field"] == "format"
        bad_config = c.post("/v1/sessions", json={"env": "sokoban", "config": {"tile_size": 1}})
        assert bad_config.status_code == 422
        assert bad_config.json()["error"]["field"] == "config.tile_size"
        bad_reasoning = c.post("/v1/sessions", json={"env": "tiny", "reasoning": {"beta_s": -1}})
        assert bad_reasoning.json()["error"]["field"] == "reasoning.beta_s"
        typo = c.post("/v1/sessions", json={"env": "sokoban", "sed": 3})
        assert typo.status_code == 422 and typo.json()["error"]["field"] == "sed"
        malformed = c.post(
            "/v1/sessions", content=b'{"env": ', headers={"content-type": "application/json"}
        )
        assert malformed.status_code == 422
        assert malformed.json()["error"]["code"] == "INVALID_ARGUMENT"
        assert "malformed JSON" in malformed.json()["error"]["message"]
        sid = c.post("/v1/sessions", json={"env": "tiny"}).json()["session_id"]
        both = c.post(f"/v1/sessions/{sid}/step", json={"step_index": 0})
        assert both.status_code == 422
        no_index = c.post(f"/v1/sessions/{sid}/step", json={"actions": []})
        assert no_index.json()["error"]["field"] == "step_index"
        big = "x" * (9 * 1024 * 1024)
        too_big = c.post(f"/v1/sessions/{sid}/step", json={"step_index": 0, "response": big})
        assert too_big.status_code == 413
        assert too_big.json()["error"]["code"] == "PAYLOAD_TOO_LARGE"

        def chunks():  # no Content-Length: the streamed size is counted
            for _ in range(10):
                yield b"x" * (1024 * 1024)

        streamed = c.post(
            "/v1/batch/step", content=chunks(), headers={"content-type": "application/json"}
        )
        assert streamed.status_code == 413
        assert c.get("/v1/nothing").json()["error"]["code"] == "NOT_FOUND"
        # the session is untouched by all of this
        ok = c.post(
            f"/v1/sessions/{sid}/step", json={"step_index": 0, "actions": [{"name": "Right"}]}
        )
        assert ok.status_code == 200 and ok.json()["step_index"] == 1
        c.delete(f"/v1/sessions/{sid}")


def test_curl_style_body_without_json_content_type(visenv_server):
    with visenv_server.client() as c:
        # curl -d sends application/x-www-form-urlencoded: the body is still read as JSON
        r = c.post("/v1/sessions", content=b'{"env": "tiny"}',
                   headers={"content-type": "application/x-www-form-urlencoded"})  # fmt: skip
        assert r.status_code == 200, r.text
        c.delete(f"/v1/sessions/{r.json()['session_id']}")


def test_frame_png_is_a_real_png_of_the_right_size(visenv_server):
    with visenv_server.client() as c:
        reply = c.post(
            "/v1/sessions", json={"env": "sokoban", "seed": 5, "image_encoding": "jpeg"}
        ).json()
        sid = reply["session_id"]
        frame = c.get(f"/v1/sessions/{sid}/frame.png")
        assert frame.status_code == 200 and frame.headers["content-type"] == "image/png"
        assert frame.content[:8] == b"\x89PNG\r\n\x1a\n"
        image = np.asarray(Image.open(io.BytesIO(frame.content)))
        assert image.shape == (96, 96, 3)  # 6x6 cells of 16 px
        assert reply["observation"]["images"][0]["encoding"] == "jpeg"
        local = registry.make("sokoban")
        np.testing.assert_array_equal(image, local.reset(5).images[0])  # lossless
        c.delete(f"/v1/sessions/{sid}")


def test_token_capacity_and_idle_reaping(start_visenv_server):
    server = start_visenv_server(workers=1, token="s3cret", max_sessions=2, idle_timeout=2.0,
                                 envs="tiny")  # fmt: skip
    with server.client() as c:
        anonymous = c.get("/v1/envs", headers={"Authorization": ""})
        assert anonymous.status_code == 401
        assert anonymous.json()["error"]["code"] == "UNAUTHENTICATED"
        wrong = c.get("/v1/envs", headers={"Authorization": "Bearer nope"})
        assert wrong.status_code == 401
        assert c.get("/health", headers={"Authorization": ""}).status_code == 200
        a = c.post("/v1/sessions", json={"env": "tiny"}).json()["session_id"]
        b = c.post("/v1/sessions", json={"env": "tiny"}).json()["session_id"]
        full = c.post("/v1/sessions", json={"env": "tiny"})
        assert full.status_code == 429 and full.json()["error"]["code"] == "CAPACITY"
        # keep `a` in use while `b` idles past the timeout (/health touches no session)
        deadline = time.monotonic() + 10
        while c.get("/health").json()["sessions"] == 2:
            assert time.monotonic() < deadline, "idle session never reaped"
            assert c.get(f"/v1/sessions/{a}").status_code == 200
            time.sleep(0.2)
        gone = c.get(f"/v1/sessions/{b}")
        assert gone.status_code == 404 and "idle" in gone.json()["error"]["message"]
        assert c.get(f"/v1/sessions/{a}").status_code == 200
        assert c.post("/v1/sessions", json={"env": "tiny"}).status_code == 200  # room again
        assert "visenv_sessions_reaped_total 1.0" in c.get("/metrics").text


def test_killed_worker_loses_only_its_sessions(start_visenv_server):
    server = start_visenv_server(workers=2, envs="tiny")
    with server.client() as c:
        created = c.post("/v1/batch/create", json={"items": [{"env": "tiny"}] * 6}).json()
        ids = [r["reply"]["session_id"] for r in created["results"]]
        health = c.get("/health").json()
        assert [w["sessions"] for w in health["workers"]] == [3, 3]  # least-loaded placement
        victim = health["workers"][0]["pid"]
        os.kill(victim, signal.SIGKILL)
        steps = {"items": [{"session_id": s, "step_index": 0, "actions": [{"name": "Right"}]}
                           for s in ids]}  # fmt: skip
        deadline = time.monotonic() + 10
        while True:  # the death is noticed within moments
            results = c.post("/v1/batch/step", json=steps).json()["results"]
            lost = [r for r in results if not r["ok"]]
            if lost or time.monotonic() > deadline:
                break
            time.sleep(0.05)
        codes = [r["error"]["code"] if not r["ok"] else "ok" for r in results]
        assert codes.count("SESSION_LOST") == 3 and codes.count("ok") == 3, codes
        survivors = [s for s, r in zip(ids, results, strict=True) if r["ok"]]
        lost_id = next(s for s, r in zip(ids, results, strict=True) if not r["ok"])
        single = c.get(f"/v1/sessions/{lost_id}")
        assert single.status_code == 410 and single.json()["error"]["code"] == "SESSION_LOST"
        # the survivors keep stepping; a replacement worker takes new sessions
        again = c.post("/v1/batch/step", json={"items": [
            {"session_id": s, "step_index": 1, "actions": [{"name": "Right"}]} for s in survivors
        ]}).json()["results"]  # fmt: skip
        assert all(r["ok"] for r in again)
        deadline = time.monotonic() + 30
        while not all(w["alive"] for w in c.get("/health").json()["workers"]):
            assert time.monotonic() < deadline, "worker was not replaced"
            time.sleep(0.1)
        health = c.get("/health").json()
        assert health["worker_restarts"] == 1 and victim not in [
            w["pid"] for w in health["workers"]
        ]
        fresh = c.post("/v1/sessions", json={"env": "tiny"})
        assert fresh.status_code == 200
        assert "visenv_worker_restarts_total 1.0" in c.get("/metrics").text


def test_env_bug_is_internal_for_that_item_only(visenv_server):
    """A bug in an environment: INTERNAL with an error id for that item, the traceback in
    the server log under that id, the error counted, and the broken session gone (its env
    is in an unknown state) while the other session goes on."""
    with visenv_server.client() as c:
        a = c.post("/v1/sessions", json={"env": "tiny"}).json()["session_id"]
        b = c.post("/v1/sessions", json={"env": "tiny"}).json()["session_id"]
        before = c.get("/health").json()["sessions"]
        results = c.post("/v1/batch/step", json={"items": [
            {"session_id": a, "step_index": 0, "actions": [{"name": "Crash"}]},
            {"session_id": b, "step_index": 0, "actions": [{"name": "Right"}]},
        ]}).json()["results"]  # fmt: skip
        error = results[0]["error"]
        assert error["code"] == "INTERNAL"
        assert "crashed on purpose" in error["message"]
        assert error["error_id"].startswith("err-") and error["error_id"] in error["message"]
        assert results[1]["ok"]
        assert c.get("/health").json()["sessions"] == before - 1
        gone = c.post(f"/v1/sessions/{a}/step", json={"step_index": 0, "actions": [
            {"name": "Right"}]})  # fmt: skip
        assert gone.status_code == 410
        assert gone.json()["error"]["code"] == "SESSION_LOST"
        assert error["error_id"] in gone.json()["error"]["message"]
        assert c.post(f"/v1/sessions/{b}/step", json={"step_index": 1, "actions": [
            {"name": "Right"}]}).status_code == 200  # fmt: skip
        assert 'visenv_errors_total{code="INTERNAL"}' in c.get("/metrics").text
        deadline = time.monotonic() + 10
        while not any(
            error["error_id"] in line and "Traceback" in "".join(visenv_server.output)
            for line in visenv_server.output
        ):
            assert time.monotonic() < deadline, "the traceback was not logged with the error id"
            time.sleep(0.1)
        c.post("/v1/batch/close", json={"session_ids": [a, b]})
