"""OpenAIPolicy and `visenv eval` against a real local chat-completions endpoint.

The endpoint is a FastAPI app served by uvicorn on 127.0.0.1. It checks every request
(messages alternate system/user/assistant/.../user, every image is a PNG data URL, no
"<image>" placeholder is left in the text) and answers by model name: "good" a fixed
well-formed Sokoban move, "down" HTTP 500, "flaky..." a 429 on its first, third, ... request.
"""

from __future__ import annotations

import asyncio
import base64
import io
import json
import subprocess
import sys
from pathlib import Path

import pytest
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse
from PIL import Image as PILImage

from clients.eval import eval_level_seeds
from clients.openai_policy import OpenAIPolicy, PolicyError, chat_messages
from clients.rollout import PolicyInput
from clients.types import Image, Observation
from tests.conftest import serve_app

ROOT = Path(__file__).resolve().parents[2]
MOVE = (
    "<think><observation>The box is above the player.</observation><reasoning>push it"
    "</reasoning><prediction>The player moves left.</prediction></think><answer>Left</answer>"
)


def _problem(body: dict) -> str | None:
    """Why a request is not a well-formed multi-turn chat with PNG data-URL images."""
    msgs = body.get("messages") or []
    roles = [m.get("role") for m in msgs]
    expected = ["system"] + ["user", "assistant"] * ((len(msgs) - 2) // 2) + ["user"]
    if roles != expected:
        return f"roles do not alternate: {roles}"
    images = 0
    for m in msgs:
        if m["role"] != "user":
            if not isinstance(m["content"], str):
                return f"{m['role']} content is not text"
            continue
        for part in m["content"]:
            if part["type"] == "text" and "<image>" in part["text"]:
                return "an <image> placeholder was left in the text"
            if part["type"] == "image_url":
                url = part["image_url"]["url"]
                head = "data:image/png;base64,"
                if not url.startswith(head):
                    return f"image is not a PNG data URL: {url[:40]}"
                PILImage.open(io.BytesIO(base64.b64decode(url[len(head) :]))).verify()
                images += 1
    if images != len(msgs) // 2:
        return f"{images} images for {len(msgs) // 2} user turns"
    return None


@pytest.fixture(scope="module")
def endpoint():
    app = FastAPI()
    app.state.calls = {}

    @app.post("/v1/chat/completions")
    async def chat(request: Request):
        body = await request.json()
        model = body["model"]
        n = app.state.calls[model] = app.state.calls.get(model, 0) + 1
        if model == "down":
            return JSONResponse({"error": "model crashed"}, status_code=500)
        if model.startswith("flaky") and n % 2 == 1:
            return JSONResponse({"error": "slow down"}, status_code=429)
        problem = _problem(body)
        if problem:
            return JSONResponse({"error": problem}, status_code=400)
        message = {"role": "assistant", "content": MOVE}
        return {"choices": [{"index": 0, "message": message, "finish_reason": "stop"}]}

    with serve_app(app) as url:
        yield f"{url}/v1", app


def _input(turns: int = 0) -> PolicyInput:
    buf = io.BytesIO()
    PILImage.new("RGB", (8, 8), (200, 10, 10)).save(buf, format="PNG")
    png = Image("png", buf.getvalue(), (8, 8, 3))
    obs = Observation("Here: <image> what now?", (png,), {}, {})
    return PolicyInput(episode=0, seed=0, turn=turns, system_prompt="sys", observation=obs,
                       history=[])  # fmt: skip


def test_messages_put_data_urls_in_place_of_placeholders():
    raw = Image("raw", bytes(range(12)), (2, 2, 3))
    inp = _input()
    inp.observation = Observation("a <image> b", (raw,), {}, {})
    msgs = chat_messages(inp)
    assert [m["role"] for m in msgs] == ["system", "user"]
    text, image, tail = msgs[1]["content"]
    assert text == {"type": "text", "text": "a "} and tail == {"type": "text", "text": " b"}
    assert image["image_url"]["url"].startswith("data:image/png;base64,")


def test_429_is_retried_then_answered(endpoint):
    url, app = endpoint
    policy = OpenAIPolicy(url, "flaky-a", retries=2, retry_wait=0.01)
    out = asyncio.run(policy([_input()]))
    assert out == [MOVE] and policy.requests == 2


def test_errors_are_returned_in_place_not_made_up(endpoint):
    url, _ = endpoint

    async def main():
        no_retry = OpenAIPolicy(url, "flaky-b", retries=0)
        return await no_retry([_input()]), await OpenAIPolicy(
            url, "down", retries=1, retry_wait=0.01
        )([_input(), _input()])

    flaky, down = asyncio.run(main())
    assert isinstance(flaky[0], PolicyError) and "429" in flaky[0].message
    assert all(isinstance(e, PolicyError) and "500" in e.message for e in down)
    assert down[0].code == "POLICY_FAILED"


def _eval(server, url, model, out, *extra):
    cmd = [sys.executable, "-m", "visenv_cli", "eval", "--server", server.grpc,
           "--endpoint", url, "--model", model, "--env", "sokoban", "--episodes", "3",
           "--format", "grounding_worldmodeling", "--max-turns", "2", "--concurrency", "2",
           "--retries", "1", "--out", str(out), *extra]  # fmt: skip
    return subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=120)


def test_visenv_eval_runs_episodes_and_writes_jsonl(visenv_server, endpoint, tmp_path):
    url, app = endpoint
    before = app.state.calls.get("good", 0)
    proc = _eval(visenv_server, url, "good", tmp_path / "r.jsonl")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    records = [json.loads(line) for line in (tmp_path / "r.jsonl").read_text().splitlines()]
    # held out from training by default: `--seed 0` does not replay a run.seed=0 run's levels
    assert [r["seed"] for r in records] == list(eval_level_seeds(0, 3))
    for r in records:
        assert r["ok"] and r["error"] is None, r["error"]
        assert 1 <= r["turns"] <= 2 and r["steps"][0]["response"] == MOVE
        # an episode file (clients/episodes.py): every turn's observation with its image
        assert r["format"] == "visenv.episode/1" and len(r["steps"]) == r["turns"]
        assert r["steps"][0]["observation"]["images"][0]["encoding"] == "png"
        assert r["reward_parts"]["format"] > 0  # the well-formed answer was graded as such
        assert r["action_valid_rate"] == 1.0
        assert r["observation_score"] is not None
    # a second turn sends the whole conversation (checked by the endpoint: 400 otherwise)
    assert app.state.calls["good"] - before == sum(r["turns"] for r in records)
    assert "success rate" in proc.stdout and "failed episodes" in proc.stdout


def test_visenv_eval_records_a_failing_endpoint_as_failed(visenv_server, endpoint, tmp_path):
    url, _ = endpoint
    proc = _eval(visenv_server, url, "down", tmp_path / "r.jsonl")
    assert proc.returncode == 1  # every episode failed
    records = [json.loads(line) for line in (tmp_path / "r.jsonl").read_text().splitlines()]
    assert len(records) == 3
    for r in records:
        assert not r["ok"] and r["return"] is None and r["turns"] == 0
        assert r["error"]["code"] == "POLICY_FAILED" and "500" in r["error"]["message"]
    assert "errors POLICY_FAILED" in proc.stdout
    cause = next(line for line in proc.stdout.splitlines() if line.startswith("POLICY_FAILED:"))
    assert "500" in cause and "(and 2 more episodes)" in cause  # the cause, not only a count
    assert "mean return" in proc.stdout and "0.000" not in proc.stdout  # no made-up zeros


@pytest.fixture(scope="module")
def tiny_qwen(tmp_path_factory) -> Path:
    from trainer.model import build_tiny_qwen

    return build_tiny_qwen(tmp_path_factory.mktemp("tiny-qwen"), seed=0)


def _train_config(server, url, model_path, out_dir):
    from trainer.config import load_config

    return load_config("examples/train_sokoban_tiny.yaml", [
        f"env.servers=['{server.grpc}']", "env.max_turns=2", f"model.path='{model_path}'",
        "model.build_tiny=false", f"run.out_dir='{out_dir}'", "run.progress=false",
        "ppo.iterations=1", "ppo.episodes_per_iteration=2", "ppo.minibatch_size=2",
        "generation.backend=openai", f"generation.base_url='{url}'",
        "generation.served_model=good", "generation.retries=0",
    ])  # fmt: skip


def test_trainer_openai_backend_builds_batches_and_trains(
    visenv_server, endpoint, tiny_qwen, tmp_path
):
    import math

    from clients import EnvClient
    from trainer.model import load_policy
    from trainer.ppo import train
    from trainer.rollout import ServerPolicy, collect, policy_factory
    from trainer.trajectory import ChatLayout, collate

    url, app = endpoint
    cfg = _train_config(visenv_server, url, tiny_qwen, tmp_path / "run")
    model, processing = load_policy(tiny_qwen)
    layout = ChatLayout(processing)
    make_policy = policy_factory(cfg.generation, model, layout, "cpu", str(tiny_qwen))
    assert isinstance(make_policy(), ServerPolicy)
    with EnvClient(visenv_server.grpc) as client:
        got = collect(client, make_policy, "sokoban", [0, 1], format=cfg.env.format, max_turns=2)
    assert len(got.episodes) == 2 and got.dropped == 0
    image_token_id = layout.tok.convert_tokens_to_ids(processing.image_token)
    batch = collate(got.episodes, layout.pad_id, image_token_id)
    for row, ep in enumerate(got.episodes):
        agent = batch.input_ids[row][batch.loss_mask[row].bool()].tolist()
        # every turn's answer, as tokens of the policy's tokenizer, each ended by <|im_end|>
        assert layout.tok.decode(agent) == ("<|im_end|>".join([MOVE] * ep.n_turns)) + "<|im_end|>"
        assert batch.token_rewards[row].sum().item() == pytest.approx(ep.info["reward"])

    before = app.state.calls.get("good", 0)
    result = train(cfg)
    (metrics,) = result.history
    assert metrics["episodes"] == 2 and metrics["episodes_dropped"] == 0
    assert math.isfinite(metrics["policy_loss"]) and math.isfinite(metrics["value_loss"])
    assert app.state.calls["good"] > before  # the rollouts came from the endpoint


def test_one_failed_answer_fails_only_its_episode(visenv_server):
    from clients import EnvClient

    def policy(batch):  # episode 1 gets no answer from its model at turn 1
        return [PolicyError("model down") if (p.episode, p.turn) == (1, 1) else MOVE for p in batch]

    with EnvClient(visenv_server.grpc) as client:
        open_before = client.status()[0]["sessions"]
        trajs = client.run_episodes(policy, "sokoban", [5, 6, 7], format="grounding_worldmodeling",
                                    max_turns=2, concurrency=2, on_error="record")  # fmt: skip
        assert [t.ok for t in trajs] == [True, False, True]
        assert trajs[1].error.code == "POLICY_FAILED" and len(trajs[1].turns) == 1
        assert all(len(t.turns) >= 1 for t in trajs) and trajs[2].turns[0].response == MOVE
        with pytest.raises(PolicyError):
            client.run_episodes(policy, "sokoban", [5, 6], max_turns=2, on_error="raise")
        # every session was reused or closed: none is left open
        assert client.status()[0]["sessions"] == open_before
