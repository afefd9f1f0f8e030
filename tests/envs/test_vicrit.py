"""ViCrit: captions true to the scene, one verified unambiguous error, exact-match reward."""

from __future__ import annotations

import json
import subprocess
import sys
from collections import Counter
from pathlib import Path

import numpy as np
import pytest
from fastapi import FastAPI, Request
from PIL import Image
from pydantic import ValidationError

from env_server.core import Action, EnvError, Representation, ResponseFormat, registry
from env_server.envs.vicrit import VicritEnv, data
from env_server.envs.vicrit import caption as cap
from env_server.reasoning.formats import SECTIONS, parse_response
from env_server.reasoning.grading import grade_for_env, grading_state
from env_server.reasoning.prompts import example_response, system_prompt
from tests.conftest import serve_app

ROOT = Path(__file__).resolve().parents[2]
EQUAL = dict.fromkeys(cap.CATEGORIES, 1.0)


@pytest.mark.parametrize("source", ["sokoban", "frozenlake"])
def test_500_captions_per_source_are_true_and_have_one_error(source: str) -> None:
    """Clean caption true under the ground truth; the corrupted one false in exactly one
    span of the stated category, with one reading; checked from the text (`verify`, which
    also runs the source env's own grader on positions and relations)."""
    categories: Counter[str] = Counter()
    for seed in range(500):
        item, scene = data.generate(seed, [source], EQUAL, render=False, check=False)
        assert item.source == source and item.clean is not None and item.original is not None
        cap.verify(scene, item.clean)
        cap.verify(
            scene, item.caption, span=item.span, category=item.category, original=item.original
        )
        with pytest.raises(cap.CaptionError):  # the corrupted caption is not a true one
            cap.verify(scene, item.caption)
        assert cap.occurrences(item.span, item.caption) == 1
        assert cap.occurrences(item.span, item.clean) == 0
        assert item.caption.replace(item.span, item.original, 1) == item.clean
        categories[item.category] += 1
    assert set(categories) == set(cap.CATEGORIES)
    assert max(categories.values()) - min(categories.values()) <= 4  # stratified: 125 each


def _sokoban_scene(seed: int = 0):
    return data.scene("sokoban", seed, render=False)[0]


def test_verify_refuses_false_ambiguous_and_misreported_captions() -> None:
    scene = _sokoban_scene(0)
    sentences = cap.WRITERS["sokoban"](scene)
    clean = cap.text_of(sentences)
    cap.verify(scene, clean)
    # a false clean caption
    wrong = clean.replace("brown bricks", "purple bricks")
    with pytest.raises(cap.CaptionError, match="false sentence"):
        cap.verify(scene, wrong)
    cap.verify(scene, wrong, span="purple", category="attribute", original="brown")
    with pytest.raises(cap.CaptionError, match="is a attribute error"):
        cap.verify(scene, wrong, span="purple", category="count")
    with pytest.raises(cap.CaptionError, match="one reading"):
        cap.verify(scene, wrong, span="bricks", category="attribute")
    # two errors
    two = wrong.replace("light grey", "dark green")
    with pytest.raises(cap.CaptionError, match="2 false sentences"):
        cap.verify(scene, two, span="purple", category="attribute")
    # the span must occur once: a colour that is in the caption already
    dup = clean.replace("brown bricks", "orange bricks")
    with pytest.raises(cap.CaptionError, match="occurs 2 times"):
        cap.verify(scene, dup, span="orange", category="attribute")
    # text that does not follow the scene's caption is refused, not guessed at
    with pytest.raises(cap.CaptionError, match="does not follow"):
        cap.verify(scene, clean.replace("outer wall of", "outer fence of"))


def test_a_position_error_with_two_readings_is_never_chosen() -> None:
    """'A hole is in the R-th row and the C-th column' false: if both another row and
    another column would make it true, it has two readings and is refused."""
    holes = [[0, 0], [1, 1]]
    truth = {(f"{cap.ORDINALS[r]} row", f"{cap.ORDINALS[c]} column") for r, c in holes}
    slots = (cap.ordinal_slot("row", 0, 0, 3), cap.ordinal_slot("column", 0, 0, 3))
    s = cap.sentence("A hole is in the {} and the {}.", slots, truth, "position:hole")
    ambiguous = s.with_word(0, "second row").with_word(1, "first column")  # (1, 0)
    assert not ambiguous.true and ambiguous.fixes() == {0, 1}
    assert cap.candidates([s], "spatial")  # others are fine
    for c in cap.candidates([s], "spatial"):
        bad = cap.apply([s], c)[0]
        assert bad.fixes() == {c.slot}


def test_exact_match_and_f1_on_hand_written_cases() -> None:
    assert cap.normalize("  Above and to the LEFT of!! ") == "above and to the left of"
    assert cap.exact_match("'Purple.'", "purple")
    assert cap.exact_match("in the same row,  to the left of", "In the same row to the left of")
    assert cap.exact_match("THREE holes", "three holes")
    assert not cap.exact_match("purple crate", "purple")
    assert not cap.exact_match("three", "three holes")
    assert cap.token_f1("three holes", "three holes") == 1.0
    assert cap.token_f1("three", "three holes") == pytest.approx(2 / 3)
    assert cap.token_f1("the purple crate", "purple") == pytest.approx(0.5)
    assert cap.token_f1("barrel", "purple") == 0.0
    assert cap.token_f1("", "purple") == 0.0
    assert cap.occurrences("left of", "left of the box, left of it") == 2
    assert cap.occurrences("eft", "left") == 0  # whole words only


def test_same_seed_same_episode_and_images() -> None:
    a, b = VicritEnv(), VicritEnv()
    oa, ob = a.reset(7), b.reset(7)
    assert oa.text == ob.text and oa.ground_truth == ob.ground_truth
    assert np.array_equal(oa.images[0], ob.images[0]) and oa.images[0].shape == (256, 256, 3)
    assert a.reset(8).text != oa.text


def test_single_turn_wrong_then_oracle() -> None:
    env = VicritEnv()
    env.reset(3)
    truth = env.ground_truth()
    tr = env.step([Action("span", payload="purple barrel")])
    assert tr.reward == 0.0 and not tr.success and tr.truncated and not tr.terminated
    assert tr.info["f1"] < 1 and tr.info["attempt"] == 1 and tr.info["feedback"] == "none"
    with pytest.raises(EnvError, match="ended"):
        env.step([Action("span", payload=truth["span"])])
    env.reset(3)
    (oracle,) = env.oracle_actions()
    tr = env.step([oracle])
    assert tr.reward == 1.0 and tr.success and tr.terminated and tr.info["f1"] == 1.0
    assert env.oracle_actions() == []


def test_empty_and_extra_answers_are_reported() -> None:
    env = VicritEnv()
    env.reset(1)
    tr = env.step([Action("span", payload=" ... ")])
    assert tr.reward == 0.0 and "no words" in tr.invalid_actions[0] and tr.actions_executed == 0
    env.reset(1)
    span = env.ground_truth()["span"]
    tr = env.step([Action("span", payload=span), Action("span", payload="x")])
    assert tr.success and tr.invalid_actions == ["span: over the limit of 1 actions per turn"]


@pytest.mark.parametrize("fmt", list(SECTIONS))  # the paper's formats
def test_every_reasoning_format_parses_and_scores(fmt: ResponseFormat) -> None:
    env = VicritEnv()
    env.reset(11)
    truth = env.ground_truth()
    sections = SECTIONS[fmt]
    says = f"The image shows {truth['original']}."
    inner = "" if sections == () else (
        f"<think>{says}</think>" if sections is None
        else "<think>" + "".join(f"<{s}>{says}</{s}>" for s in sections) + "</think>"
    )  # fmt: skip
    response = f"{inner}<answer>{truth['span'].upper()}!</answer>"
    parsed = parse_response(response, fmt, env.action_space)
    assert parsed.format_ok, parsed.error
    assert env.step(parsed.actions).reward == 1.0
    for rep in Representation:  # the prompt's own example is well-formed too
        assert parse_response(example_response(env, fmt, rep), fmt, env.action_space).format_ok
        assert "span" in system_prompt(env, fmt, rep)


def test_world_model_grading_names_the_true_words() -> None:
    env = VicritEnv()
    env.reset(2)
    truth = grading_state(env, env.ground_truth())
    rep = Representation.NATURAL
    assert grade_for_env(env, f"It is really {truth['original']}.", truth, rep) == 1.0
    assert grade_for_env(env, "nothing relevant", truth, rep) == 0.0
    with pytest.raises(ValueError, match="original"):
        grade_for_env(env, "x", {"span": "a", "category": "count", "original": None}, rep)


def test_category_weights_are_honoured_stratified_and_random() -> None:
    weights = {"object": 1.0, "count": 3.0}
    for balance in ("stratified", "random"):
        drawn = Counter(
            data.draw_category(s, np.random.default_rng(s), weights, balance) for s in range(400)
        )
        assert set(drawn) == {"object", "count"}
        assert 70 <= drawn["object"] <= 130, (balance, drawn)  # a quarter of 400
        if balance == "stratified":
            assert drawn["object"] in (99, 100, 101)


def test_category_balance_and_config_errors() -> None:
    env = VicritEnv(VicritEnv.Config(category_weights={"count": 1.0}, sources=["frozenlake"]))
    for seed in range(5):
        env.reset(seed)
        assert env.ground_truth()["category"] == "count"
        assert env.ground_truth()["source"] == "frozenlake"
    for bad, field in (
        ({"category_weights": {"colour": 1.0}}, "category_weights"),
        ({"category_weights": {"count": 0.0}}, "category_weights"),
        ({"sources": ["navigation"]}, "sources"),
        ({"max_turns": 3}, "feedback"),
        ({"feedback": "unary", "max_attempts": 3, "max_turns": 2}, "max_attempts"),
    ):
        with pytest.raises(ValidationError) as exc:
            registry.make_config("vicrit", bad)
        assert exc.value.errors()[0]["loc"][0] == field, bad
    with pytest.raises(EnvError, match=r"seed must be an integer in \[0, 2\*\*63\)"):
        VicritEnv().reset(-1)


def _write_jsonl(folder, rows) -> None:
    Image.fromarray(np.full((20, 30, 3), 200, np.uint8)).save(folder / "pic.png")
    (folder / "set.jsonl").write_text("\n".join(json.dumps(r) for r in rows) + "\n")


def test_user_jsonl_under_the_data_dir(tmp_path, monkeypatch) -> None:
    folder = tmp_path / "vicrit"
    folder.mkdir()
    row = {"image": "pic.png", "caption": "A grey square. It has three dots.",
           "span": "three dots", "category": "count", "original": "two dots"}  # fmt: skip
    _write_jsonl(folder, [row, {**row, "category": "attribute", "span": "grey"}])
    config = {"jsonl_path": "vicrit/set.jsonl", "category_weights": {"count": 1.0}}
    with pytest.raises(EnvError, match="VISENV_DATA_DIR"):
        registry.make("vicrit", config)
    monkeypatch.setenv("VISENV_DATA_DIR", str(tmp_path))
    env = registry.make("vicrit", config)
    obs = env.reset(0)
    assert "three dots" in obs.text and obs.images[0].shape == (171, 256, 3)
    assert env.ground_truth()["source"] == "jsonl" and env.ground_truth()["row"] == 1
    assert env.step(env.oracle_actions()).reward == 1.0
    for bad, message in (
        ({**row, "span": "four dots"}, "occurs 0 times"),
        ({**row, "category": "colour"}, "category"),
        ({**row, "image": "../../etc/passwd"}, "outside"),
        ({**row, "caption": 3}, "'caption'"),
    ):
        _write_jsonl(folder, [bad])
        with pytest.raises(EnvError, match=message):
            registry.make("vicrit", config)


def test_snapshot_restore_replays_the_same_answer() -> None:
    env = VicritEnv(VicritEnv.Config(feedback="unary", max_attempts=3))
    env.reset(4)
    env.step([Action("span", payload="wrong words")])
    snap = env.snapshot()
    first = env.step(env.oracle_actions())
    env.restore(snap)
    again = env.step(env.oracle_actions())
    assert first.reward == again.reward == pytest.approx(0.8) and again.info["attempt"] == 2


def test_a_real_server_over_rest_grpc_and_visenv_eval(start_visenv_server, tmp_path) -> None:
    from clients import EnvClient, SessionOptions

    server = start_visenv_server(workers=1, envs="vicrit")
    with server.client() as http:
        listed = {e["name"]: e for e in http.get("/v1/envs").json()["envs"]}
        assert listed["vicrit"]["available"]
        assert listed["vicrit"]["action_space"]["kind"] == "document"
        reply = http.post("/v1/sessions", json={"env": "vicrit", "seed": 5})
        assert reply.status_code == 200, reply.text
        body = reply.json()
        sid, truth = body["session_id"], body["observation"]["ground_truth"]
        assert len(body["observation"]["images"]) == 1
        assert "Caption:" in body["observation"]["text"]
        says = f"The image shows {truth['original']}."
        response = (
            f"<think><observation>{says}</observation><reasoning>r</reasoning>"
            f"<prediction>{says}</prediction></think><answer>{truth['span']}</answer>"
        )
        step = http.post(f"/v1/sessions/{sid}/step", json={"step_index": 0, "response": response})
        assert step.status_code == 200, step.text
        done = step.json()
        assert done["success"] and done["reward_parts"]["env"] == 1.0 and done["terminated"]
        assert done["info"]["observation_score"] == 1.0
        bad = http.post("/v1/sessions", json={"env": "vicrit", "config": {"sources": ["x"]}})
        assert bad.status_code == 422, bad.text
        assert bad.json()["error"]["code"] == "INVALID_ARGUMENT"
        assert bad.json()["error"]["field"].startswith("config")
    with EnvClient(server.grpc, transport="grpc") as client:
        options = SessionOptions(env="vicrit", seed=6, format="no_think",
                                 config={"feedback": "unary", "max_attempts": 2})  # fmt: skip
        (first,) = client.create([options])
        sid = first.session_id
        (wrong,) = client.step([sid], ["<answer>not it at all</answer>"])
        assert not wrong.done and len(wrong.observation.images) == 0
        assert wrong.observation.text.startswith("Let's try again.")
        span = first.observation.ground_truth["span"]
        (right,) = client.step([sid], [f"<answer>{span}</answer>"])
        assert right.success and right.reward_parts.env == pytest.approx(0.8)
        assert right.info["attempt"] == 2
    # `visenv eval` on vicrit: a model behind an OpenAI-style endpoint (a test double that
    # always names the same span) plays default episodes through the same server
    app = FastAPI()

    @app.post("/v1/chat/completions")
    async def chat(request: Request):
        message = {"role": "assistant", "content": "<answer>purple barrel</answer>"}
        return {"choices": [{"index": 0, "message": message, "finish_reason": "stop"}]}

    def run_eval(url: str, out: Path, *extra: str) -> list[dict]:
        proc = subprocess.run(
            [sys.executable, "-m", "visenv_cli", "eval", "--server", server.grpc,
             "--endpoint", f"{url}/v1", "--model", "fixed", "--env", "vicrit",
             "--episodes", "2", "--format", "no_think", "--out", str(out), *extra],
            cwd=ROOT, capture_output=True, text=True, timeout=120,
        )  # fmt: skip
        assert proc.returncode == 0, proc.stdout + proc.stderr
        return [json.loads(line) for line in out.read_text().splitlines()]

    with serve_app(app) as url:
        records = run_eval(url, tmp_path / "eval.jsonl")
        # --config: the env's config, here unary feedback with two attempts per episode
        unary = run_eval(url, tmp_path / "unary.jsonl",
                         "--config", '{"feedback": "unary", "max_attempts": 2}')  # fmt: skip
    assert len(records) == 2 and all(r["ok"] and r["turns"] == 1 for r in records)
    assert all(r["action_valid_rate"] == 1.0 and not r["success"] for r in records)
    assert len(unary) == 2 and all(r["ok"] and r["turns"] == 2 for r in unary)
