"""VAGEN's two protocols against a real `visenv serve`, with clients written here from the
peers' wire shapes (env_server/api/compat/vagen.py and vagen_legacy.py):

- remote envs: multipart/form-data in (a JSON part named `data`), multipart/mixed out (the
  JSON part, then raw image/png parts), auth by X-API-Key or ?token=;
- legacy batch server: JSON with base64 `__pil_image__` images, served without a token and
  only when the operator enables it.
"""

from __future__ import annotations

import base64
import email.parser
import email.policy
import io
import json
import time

import httpx
import pytest
from PIL import Image

from env_server.core import Representation, registry
from env_server.testing.launcher import launch_servers

TOKEN = "compat-secret"
PNG = b"\x89PNG\r\n\x1a\n"


@pytest.fixture(scope="module")
def servers():
    """A: token, legacy enabled, cap 6.  B: 1 s idle timeout (for the reaper)."""
    a, b = launch_servers(
        {"token": TOKEN, "max_sessions": 6, "extra_env": {"VISENV_VAGEN_LEGACY": "true"}},
        {"workers": 1, "envs": "sokoban", "idle_timeout": 1.0},
    )
    yield a, b
    a.stop()
    b.stop()


# ---------------------------------------------------------------- a client from the shapes
def post_multipart(url: str, data: dict, **kwargs) -> httpx.Response:
    files = {"data": ("data.json", json.dumps(data).encode(), "application/json")}
    return httpx.post(url, files=files, timeout=60, **kwargs)


def read_mixed(response: httpx.Response) -> tuple[dict, list[bytes]]:
    """(the JSON part, the image parts' bytes) of a multipart/mixed reply."""
    assert response.status_code == 200, response.text
    content_type = response.headers["content-type"]
    assert content_type.startswith("multipart/mixed; boundary=")
    head = f"Content-Type: {content_type}\r\n\r\n".encode()
    message = email.parser.BytesParser(policy=email.policy.HTTP).parsebytes(head + response.content)
    parts = list(message.iter_parts())
    assert parts[0].get_content_type() == "application/json"
    images = []
    for i, part in enumerate(parts[1:]):
        assert part.get_content_type() == "image/png"
        assert part.get_filename() == f"{i}.png"
        assert "content-transfer-encoding" not in part  # raw bytes, no base64
        images.append(part.get_payload(decode=True))
    return json.loads(parts[0].get_payload(decode=True)), images


class RemoteEnv:
    """VAGEN's GymImageEnvClient, reduced to its wire: connect on the first reset."""

    def __init__(self, base: str, env_config: dict, **auth) -> None:
        self.base, self.env_config, self.auth, self.session_id = base, env_config, auth, None

    def call(self, method: str, **params) -> tuple[dict, list[bytes]]:
        body = {"session_id": self.session_id, "method": method, "params": params}
        return read_mixed(post_multipart(self.base + "/call", body, **self.auth))

    def reset(self, seed: int) -> tuple[dict, list[bytes]]:
        if self.session_id is None:
            data, images = read_mixed(
                post_multipart(
                    self.base + "/connect", {"env_config": self.env_config, "seed": seed},
                    **self.auth,
                )
            )  # fmt: skip
            self.session_id = data["session_id"]
            return data, images
        return self.call("reset", seed=seed)


def oracle_response(env, actions, main: bool = False) -> str:
    """The paper's grounding_worldmodeling layout, or VAGEN main's `wm` one (`main`)."""
    before = env.describe(env.ground_truth(), Representation.NATURAL)
    env.step(actions)
    after = env.describe(env.ground_truth(), Representation.NATURAL)
    answer = ", ".join(a.name for a in actions)
    if main:
        return (
            f"<observation>{before}</observation>\n<think>Plan.</think>\n"
            f"<answer>{answer}</answer>\n<prediction>{after}</prediction>"
        )
    return (
        f"<think><observation>{before}</observation><reasoning>Plan.</reasoning>"
        f"<prediction>{after}</prediction></think><answer>{answer}</answer>"
    )


def sessions_gauge(server) -> float:
    text = httpx.get(server.url + "/metrics", headers=server.headers).text
    return float(next(line.split()[1] for line in text.splitlines() if line.startswith(
        "visenv_sessions ")))  # fmt: skip


# ---------------------------------------------------------------- VAGEN remote envs
def test_remote_episode_to_success_multipart_both_ways(servers):
    a, _ = servers
    base = a.url + "/compat/vagen/sokoban"
    assert httpx.get(base + "/health").json()["ok"] is True  # open, like /health
    env = RemoteEnv(base, {"prompt_format": "wm", "format_reward": 0.25}, headers={
        "X-API-Key": TOKEN})  # fmt: skip
    data, images = env.reset(seed=3)
    assert data["session_id"].startswith("s-")
    assert data["obs"].count("<image>") == len(images) == 1
    assert images[0].startswith(PNG) and Image.open(io.BytesIO(images[0])).size[0] > 0
    local = registry.make("sokoban")
    local.reset(3)
    assert data["info"]["ground_truth"] == local.ground_truth()
    prompt, none = env.call("system_prompt")
    assert "Sokoban" in prompt["obs"] and none == []
    for _ in range(30):
        text = oracle_response(local, local.oracle_actions(), main=True)
        data, images = env.call("step", action_str=text)
        assert set(data) == {"obs", "reward", "done", "info"} and len(images) == 1
        info = data["info"]
        assert info["action_valid"] and info["reward_parts"]["format"] == 0.25
        assert info["reward_parts"]["observation"] == 0.0  # VAGEN main: no world-model reward
        assert info["metrics"]["turn_metrics"]["action_is_valid"] is True
        if data["done"]:
            break
    assert data["done"] and info["success"] is True  # VAGEN's loop stops on info["success"]
    assert data["reward"] == 1.25  # VAGEN main's success_reward (1.0) + the format reward
    assert info["metrics"]["traj_metrics"]["success"] is True
    again, images = env.call("reset", seed=4)
    assert set(again) == {"obs", "info"} and len(images) == 1
    assert again["info"]["ground_truth"] != data["info"]["ground_truth"]
    stats = httpx.get(base + "/sessions", params={"token": TOKEN}).json()
    assert env.session_id in [s["session_id"] for s in stats["sessions"]]
    assert stats["session_timeout"] == 600
    assert env.call("close")[0] == {"closed": True}
    gone = post_multipart(base + "/call", {"session_id": env.session_id, "method": "step",
                                           "params": {"action_str": "x"}},
                          headers={"X-API-Key": TOKEN})  # fmt: skip
    assert gone.status_code == 404


def test_remote_errors_auth_config_capacity(servers):
    a, _ = servers
    base = a.url + "/compat/vagen/frozenlake"
    assert post_multipart(base + "/connect", {"env_config": {}}).status_code == 401
    wrong = post_multipart(base + "/connect", {"env_config": {}}, headers={"X-API-Key": "no"})
    assert wrong.status_code == 401
    bad = post_multipart(base + "/connect", {"env_config": {"desc": ["SF", "HG"]}},
                         params={"token": TOKEN})  # fmt: skip
    assert bad.status_code == 400 and bad.json()["error"]["field"] == "env_config.desc"
    value = post_multipart(base + "/connect", {"env_config": {"size": 99}},
                           params={"token": TOKEN})  # fmt: skip
    assert value.status_code == 400 and "size" in value.json()["error"]["message"]
    for not_an_object in ([], 0, "", [1]):  # never read as the defaults
        refused = post_multipart(base + "/connect", {"env_config": not_an_object},
                                 params={"token": TOKEN})  # fmt: skip
        assert refused.status_code == 400, (not_an_object, refused.text)
        assert refused.json()["error"]["field"] == "env_config"
    form = httpx.post(base + "/connect", content=b"{not json", params={"token": TOKEN},
                      headers={"content-type": "multipart/form-data; boundary=x"})  # fmt: skip
    assert form.status_code == 400
    unknown = post_multipart(base + "/call", {"session_id": "s-0", "method": "step"},
                             params={"token": TOKEN})  # fmt: skip
    assert unknown.status_code == 404
    # a connect without a seed makes the session but answers only its id
    data, images = read_mixed(
        post_multipart(
            base + "/connect",
            {"env_config": {"is_slippery": False, "size": 4}},
            params={"token": TOKEN},
        )  # fmt: skip
    )
    assert set(data) == {"session_id"} and images == []
    # the cap (6, shared with every transport) answers 503, and nothing is left behind
    opened = [data["session_id"]]
    while True:
        reply = post_multipart(base + "/connect", {"env_config": {}}, params={"token": TOKEN})
        if reply.status_code != 200:
            break
        opened.append(read_mixed(reply)[0]["session_id"])
        assert len(opened) <= 6
    assert reply.status_code == 503 and reply.json()["error"]["code"] == "CAPACITY"
    assert sessions_gauge(a) == 6
    for sid in opened:
        post_multipart(base + "/call", {"session_id": sid, "method": "close"},
                       params={"token": TOKEN})  # fmt: skip
    assert sessions_gauge(a) == 0


def test_adapter_sessions_are_reaped_when_idle(servers):
    _, b = servers  # idle timeout 1 s, no token
    base = b.url + "/compat/vagen/sokoban"
    env = RemoteEnv(base, {})
    env.reset(seed=1)
    assert sessions_gauge(b) == 1
    deadline = time.monotonic() + 20
    while sessions_gauge(b) and time.monotonic() < deadline:
        time.sleep(0.25)
    assert sessions_gauge(b) == 0
    gone = post_multipart(base + "/call", {"session_id": env.session_id, "method": "reset"})
    assert gone.status_code == 404
    assert httpx.get(base + "/sessions").json()["num_sessions"] == 0


# ---------------------------------------------------------------- VAGEN legacy batch server
def decode_obs(obs: dict) -> list[Image.Image]:
    images = obs.get("multi_modal_data", {}).get("<image>", [])
    return [Image.open(io.BytesIO(base64.b64decode(i["__pil_image__"]))) for i in images]


def test_legacy_batch_episode_and_per_item_failures(servers):
    a, _ = servers
    base = a.url + "/compat/vagen-legacy"
    with httpx.Client(base_url=base, timeout=60) as c:  # VAGEN's client sends no token
        assert c.get("/health").json()["status"] == "ok"
        made = c.post("/environments", json={"ids2configs": {
            "0": {"env_name": "sokoban", "env_config": {"prompt_format": "grounding_worldmodeling",
                                                       "use_state_reward": True}, "seed": 3},
            "1": {"env_name": "frozenlake", "env_config": {}},
            "2": {"env_name": "sokoban", "env_config": {"max_steps": 5}},
        }}).json()  # fmt: skip
        assert made["success"] is False and list(made["errors"]) == ["2"]
        assert made["errors"]["2"]["field"] == "env_config.max_steps"
        results = c.post("/batch/reset", json={"ids2seeds": {"0": 3, "1": 7, "9": 1}}).json()[
            "results"]  # fmt: skip
        assert results["9"] == [{}, {"error": results["9"][1]["error"]}]
        assert results["9"][1]["error"]["code"] == "NOT_FOUND"
        for pid in ("0", "1"):
            obs, info = results[pid]
            assert obs["obs_str"].count("<image>") == len(decode_obs(obs)) == 1
            assert decode_obs(obs)[0].format == "PNG"
            assert {"turn_metrics", "traj_metrics"} <= set(info["metrics"])
        prompts = c.post("/batch/system_prompt", json={"env_ids": ["0", "1"]}).json()
        assert "Sokoban" in prompts["system_prompts"]["0"]
        assert "FrozenLake" in prompts["system_prompts"]["1"]
        local = registry.make("sokoban")
        local.reset(3)
        for _ in range(30):
            text = oracle_response(local, local.oracle_actions())
            step = c.post("/batch/step", json={"ids2actions": {"0": text, "1": 42}}).json()
            obs, reward, done, info = step["results"]["0"]
            assert step["results"]["1"][:3] == [{}, 0.0, True]  # the bad item answers alone
            assert step["results"]["1"][3]["error"]["code"] == "INVALID_ARGUMENT"
            assert info["llm_raw_response"] == text
            assert info["metrics"]["turn_metrics"]["action_is_valid"] is True
            assert info["reward_parts"]["observation"] == 0.5  # use_state_reward: graded
            if done:
                break
        assert done and info["success"] and info["metrics"]["traj_metrics"]["success"]
        rewards = c.post("/batch/reward", json={"env_ids": ["0", "9"]}).json()
        assert rewards["rewards"] == {"0": 0.0} and list(rewards["errors"]) == ["9"]
        # ids are per credential: a token-bearing trainer does not see the anonymous "0"
        other = c.post("/batch/reset", json={"ids2seeds": {"0": 1}},
                       headers={"X-API-Key": TOKEN}).json()  # fmt: skip
        assert other["results"]["0"][1]["error"]["code"] == "NOT_FOUND"
        closed = c.post("/batch/close", json={"env_ids": ["0", "1"]}).json()
        assert closed == {"status": "success", "errors": {}}
        after = c.post("/batch/step", json={"ids2actions": {"0": "x"}}).json()["results"]["0"]
        assert after[:3] == [{}, 0.0, True] and after[3]["error"]["code"] == "NOT_FOUND"
        assert c.post("/batch/step", json={"ids": {}}).status_code == 400


def test_legacy_adapter_is_off_unless_enabled(visenv_server):
    reply = httpx.post(visenv_server.url + "/compat/vagen-legacy/batch/reset",
                       json={"ids2seeds": {}})  # fmt: skip
    assert reply.status_code == 404


# ---------------------------------------------------------------- the pieces, in-process
def test_vagen_config_keys_are_translated_or_refused_by_name():
    from env_server.api.compat.vagen_config import session_options
    from env_server.service.models import ServiceError

    sokoban = {"dim_room", "num_boxes", "max_actions_per_turn", "min_solution_length",
               "max_solution_length", "solved_reward", "max_turns"}  # fmt: skip
    options = session_options("sokoban", {
        "prompt_format": "grounding_symbolic", "format_reward": 0.1, "use_state_reward": False,
        "max_actions_per_step": 2, "min_solution_steps": [2, 6], "success_reward": 1.0,
        "action_sep": ",", "image_placeholder": "<image>", "num_boxes": 2, "env_name": "sokoban",
    }, sokoban, seed=4)  # fmt: skip
    assert options == {
        "env": "sokoban", "seed": 4, "format": "grounding", "representation": "symbolic",
        "image_encoding": "png",
        "reasoning": {"format_reward": 0.1, "beta_s": 0.0, "beta_w": 0.0},
        "config": {"max_actions_per_turn": 2, "min_solution_length": 2,
                   "max_solution_length": 6, "solved_reward": 1.0, "num_boxes": 2},
    }  # fmt: skip
    weighted = session_options("sokoban", {"prompt_format": "wm", "use_state_reward": True,
                                           "grounding_reward_weight": 0.3}, sokoban)  # fmt: skip
    assert weighted["format"] == "grounding_worldmodeling"
    assert weighted["reasoning"] == {"beta_s": 0.3}
    for env, fields, config, field in [
        ("sokoban", sokoban, {"max_steps": 100}, "env_config.max_steps"),
        ("sokoban", sokoban, {"prompt_format": "cot"}, "env_config.prompt_format"),
        ("sokoban", sokoban, {"action_sep": "|"}, "env_config.action_sep"),
        ("sokoban", sokoban, {"render_mode": "text"}, "env_config.render_mode"),
        ("svg", {"max_turns"}, {"max_actions_per_step": 1}, "env_config.max_actions_per_step"),
        ("frozenlake", {"size"}, {"is_slippery": True}, "env_config.is_slippery"),
        ("frozenlake", {"size"}, {"env_name": "sokoban"}, "env_config.env_name"),
    ]:
        with pytest.raises(ServiceError) as caught:
            session_options(env, config, fields)
        assert caught.value.code == "INVALID_ARGUMENT" and caught.value.field == field


def test_id_table_is_bounded_reaped_and_per_namespace():
    from env_server.api.compat.common import Binding, IdTable, namespace

    table = IdTable(max_entries=2, idle_timeout=0.2)
    table.put("a", "0", Binding("s-1", "sokoban"))
    table.put("b", "0", Binding("s-2", "sokoban"))
    assert table.room() == 0 and table.get("a", "0").session_id == "s-1"
    assert table.get("b", "0").session_id == "s-2" and table.get("c", "0") is None
    time.sleep(0.3)
    assert table.room() == 2 and table.get("a", "0") is None  # idle past the timeout: forgotten
    assert namespace({}, b"") == ""
    bearer = namespace({b"authorization": b"Bearer t"}, b"")
    assert bearer == namespace({b"x-api-key": b"t"}, b"") == namespace({}, b"token=t") != ""
    assert namespace({b"x-api-key": b"u"}, b"") != bearer


def test_vagen_main_stock_configs_translate_and_what_cannot_be_done_is_refused_by_name():
    from env_server.api.compat.vagen_config import main_session_options
    from env_server.service.models import ServiceError, SessionOptions

    def fields(env):
        return set(type(registry.make_config(env, {})).model_fields)

    # examples/evaluate/*/config.yaml of VAGEN main (commit 2936322a), client keys removed
    stock = {
        "sokoban": {"dim_room": [6, 6], "max_steps": 100, "num_boxes": 1, "render_mode": "vision",
                    "max_actions_per_step": 3, "action_sep": ",",
                    "use_example_in_sys_prompt": True, "prompt_format": "wm"},
        "frozenlake": {"render_mode": "vision", "size": 4, "p": 0.8, "is_slippery": False,
                       "slip_prob": 0.0, "max_actions_per_step": 5},
        "navigation": {"eval_set": "common_sense", "prompt_format": "eval_mode",
                       "max_actions_per_step": 5},
        "primitive_skill": {"env_id": "PlaceTwoCube", "prompt_format": "wm",
                            "max_actions_per_step": 2, "action_sep": "|",
                            "render_mode": "vision", "format_reward": 0.1,
                            "success_reward": 10.0},
    }  # fmt: skip
    got = {env: main_session_options(env, c, fields(env), seed=1) for env, c in stock.items()}
    for options in got.values():
        SessionOptions.model_validate(options)
    assert [got[e]["format"] for e in stock] == ["vagen_wm", "vagen_free_think",
                                                 "vagen_eval_mode", "vagen_wm"]  # fmt: skip
    assert got["sokoban"]["config"]["solved_reward"] == 1.0  # VAGEN main's default
    assert got["sokoban"]["config"]["step_reward"] == 0.0
    assert got["sokoban"]["reasoning"]["format_reward"] == 0.1
    assert got["frozenlake"]["config"]["max_actions_per_turn"] == 5
    assert got["navigation"]["config"]["task_set"] == "common_sense"
    assert got["navigation"]["reasoning"] == {
        "guard": {"enabled": False}, "answer_tag": "action", "format_reward": 0.01, "action_sep": "|",
        "prompt_example": False, "beta_s": 0.0, "beta_w": 0.0}  # fmt: skip
    assert got["primitive_skill"]["config"] == {"task": "PlaceTwoCube", "success_reward": 10.0}
    state = main_session_options("primitive_skill", {"use_state_reward": True,
                                                     "grounding_reward_weight": 0.2},
                                 fields("primitive_skill"))  # fmt: skip
    assert state["reasoning"]["beta_s"] == 0.2 and "beta_w" not in state["reasoning"]
    ours = main_session_options("sokoban", {"prompt_format": "grounding_worldmodeling"},
                                fields("sokoban"))  # fmt: skip
    assert ours["format"] == "grounding_worldmodeling"  # our own names are accepted too
    for env, config, field in [
        ("frozenlake", {"slip_prob": 0.1}, "env_config.slip_prob"),
        ("frozenlake", {"desc": ["SF", "HG"]}, "env_config.desc"),
        ("frozenlake", {"prompt_format": "free_wm"}, "env_config.prompt_format"),
        ("sokoban", {"prompt_format": "eval_mode"}, "env_config.prompt_format"),
        ("sokoban", {"render_mode": "text"}, "env_config.render_mode"),
        ("navigation", {"format_reward": 1.0}, "env_config.format_reward"),
        ("navigation", {"multiview": True}, "env_config.multiview"),
        ("primitive_skill", {"max_actions_per_step": 3}, "env_config.max_actions_per_step"),
        ("primitive_skill", {"teleport": True}, "env_config.teleport"),
    ]:
        with pytest.raises(ServiceError) as caught:
            main_session_options(env, config, fields(env))
        assert caught.value.code == "INVALID_ARGUMENT" and caught.value.field == field
