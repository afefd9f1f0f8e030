"""Tests of the SVG reconstruction environment (real OpenMoji data, real cairosvg renders)."""

from __future__ import annotations

import json
import os
import signal

import numpy as np
import pytest

from env_server.core import (
    IMAGE_PLACEHOLDER,
    Action,
    ActionKind,
    EnvError,
    Representation,
    ResponseFormat,
    registry,
)
from env_server.envs.svg import SvgConfig, SvgEnv, data
from env_server.envs.svg.rasterize import InvalidSvg, Limits, check_svg, render_svg, renderer
from env_server.envs.svg.score import OfflineScorer

SVG = '<svg xmlns="http://www.w3.org/2000/svg" viewBox="0 0 72 72">{}</svg>'
XSVG = '<svg xmlns="http://www.w3.org/2000/svg" xmlns:xlink="http://www.w3.org/1999/xlink" viewBox="0 0 72 72">{}</svg>'
CRUDE_GRIN = SVG.format(
    '<circle cx="36" cy="36" r="23" fill="#FCEA2B" stroke="#000" stroke-width="2"/>'
    '<circle cx="27" cy="31" r="3"/><circle cx="45" cy="31" r="3"/>'
)
WRONG = SVG.format('<rect x="5" y="40" width="30" height="30" fill="#1E50A0"/>')


@pytest.fixture(scope="module")
def env() -> SvgEnv:
    env = registry.make("svg")
    assert isinstance(env, SvgEnv)
    yield env
    env.close()


def svg_action(svg: str) -> list[Action]:
    return [Action(name="svg", payload=svg)]


def grin_icon() -> data.Icon:
    return next(i for i in data.openmoji_icons() if i.id == "1F600")


# ---------------------------------------------------------------- data
def test_openmoji_set_has_one_icon_per_base_emoji() -> None:
    icons = data.openmoji_icons()
    ids = [i.id for i in icons]
    assert len(ids) > 1500 and ids == sorted(ids) and len(set(ids)) == len(ids)
    assert "1F600" in ids and "1F44D" in ids
    assert not any(tone in i for i in ids for tone in ("1F3FB", "1F3FC", "1F3FD", "1F3FE", "1F3FF"))
    assert not any(i.startswith(("E", "F")) and len(i) == 4 for i in ids)  # no private-use extras
    described = sum(i.description is not None for i in icons)
    assert described / len(icons) > 0.95
    assert grin_icon().description == "grinning face"
    assert "<svg" in grin_icon().source()


def test_descriptions_from_unicode_names() -> None:
    assert data.emoji_description([0x1F1EB, 0x1F1F7]) == "flag: FR"
    assert data.emoji_description([0x0031, 0xFE0F, 0x20E3]) == "digit one + keycap"
    assert data.emoji_description([0x1F468, 0x200D, 0x1F373]) == "man + cooking"
    assert (
        data.emoji_description([0x1F3F4, 0xE0067, 0xE0062, 0xE0065, 0xE006E, 0xE0067, 0xE007F])
        == "flag: gbeng"
    )
    # Unicode 15 emoji (newer than Python 3.11's tables) are named too (unicodedata2)
    assert data.emoji_description([0x1FA8F]) == "shovel"
    # so every icon can grade an <observation>/<prediction> (none silently scores 0)
    assert [icon.id for icon in data.openmoji_icons() if icon.description is None] == []


def test_split_is_deterministic_disjoint_and_seeded() -> None:
    icons = data.openmoji_icons()
    train = data.select(icons, "train", 0, 0.1)
    test = data.select(icons, "test", 0, 0.1)
    assert {i.id for i in train}.isdisjoint(i.id for i in test)
    assert len(train) + len(test) == len(icons)
    assert 0.05 < len(test) / len(icons) < 0.15
    assert [i.id for i in data.select(icons, "test", 0, 0.1)] == [i.id for i in test]
    assert [i.id for i in data.select(icons, "test", 1, 0.1)] != [i.id for i in test]
    test_env = SvgEnv(SvgConfig(split="test"))
    assert {i.id for i in test_env.icons} == {i.id for i in test}


def test_folder_and_jsonl_sources(tmp_path, monkeypatch) -> None:
    monkeypatch.setenv(data.DATA_DIR_ENV, str(tmp_path))
    folder = tmp_path / "icons"
    folder.mkdir()
    (folder / "red.svg").write_text(SVG.format('<rect width="72" height="72" fill="red"/>'))
    (folder / "blue.svg").write_text(SVG.format('<circle cx="36" cy="36" r="30" fill="blue"/>'))
    env = SvgEnv(SvgConfig(svg_dir=str(folder), split="all"))
    assert [i.id for i in env.icons] == ["blue", "red"]
    obs = env.reset(0)
    assert obs.ground_truth["icon_id"] in {"blue", "red"}
    assert env.step(env.oracle_actions()).success

    jsonl = tmp_path / "set.jsonl"
    rows = [
        {
            "id": "dot",
            "svg": SVG.format('<circle cx="36" cy="36" r="9"/>'),
            "description": "a black dot",
        }
    ]
    jsonl.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    env = SvgEnv(SvgConfig(jsonl_path=str(jsonl), split="all"))
    obs = env.reset(5)
    assert obs.ground_truth["description"] == "a black dot"
    assert "a black dot" in env.describe(obs.ground_truth, Representation.NATURAL)

    jsonl.write_text('{"id": "x"}\n')
    with pytest.raises(EnvError, match="'svg' string") as err:
        SvgEnv(SvgConfig(jsonl_path=str(jsonl)))
    assert err.value.code == "INVALID_ARGUMENT"
    (folder / "huge.svg").write_text(SVG.format("<g/>" * 30_000))
    huge = SvgEnv(SvgConfig(svg_dir=str(folder), split="all"))
    seed = next(
        s for s in range(50) if huge.icons[np.random.default_rng(s).integers(3)].id == "huge"
    )
    with pytest.raises(EnvError, match="'huge' cannot be rendered: SVG is 100001 bytes") as err:
        huge.reset(seed)
    assert err.value.code == "INVALID_ARGUMENT"
    with pytest.raises(EnvError, match="not a folder"):
        SvgEnv(SvgConfig(svg_dir=str(tmp_path / "missing")))
    with pytest.raises(ValueError, match="not both"):
        SvgConfig(svg_dir=str(folder), jsonl_path=str(jsonl))
    assert [i.id for i in SvgEnv(SvgConfig(svg_dir="icons", split="all")).icons][:2] == [
        "blue",
        "huge",
    ]  # fmt: skip  (relative names are inside the data folder)


def test_user_data_only_inside_the_operators_data_folder(tmp_path, monkeypatch) -> None:
    """Session configs come from clients: the server must not read arbitrary files."""
    monkeypatch.delenv(data.DATA_DIR_ENV, raising=False)
    with pytest.raises(EnvError, match="VISENV_DATA_DIR") as err:
        SvgEnv(SvgConfig(jsonl_path="/etc/passwd"))
    assert err.value.code == "INVALID_ARGUMENT"
    monkeypatch.setenv(data.DATA_DIR_ENV, str(tmp_path))
    for outside in ("/etc", "../../etc", str(tmp_path / ".." / "x")):
        with pytest.raises(EnvError, match="outside the server's data folder"):
            SvgEnv(SvgConfig(svg_dir=outside))


# ---------------------------------------------------------------- episode
# determinism, snapshots, preconditions and plain types: tests/envs/test_contract.py
def test_reset_shows_an_icon_on_white(env: SvgEnv) -> None:
    obs = env.reset(7)
    assert obs.text.count(IMAGE_PLACEHOLDER) == 1 and len(obs.images) == 1
    image = obs.images[0]
    assert image.shape == (256, 256, 3) and image.dtype == np.uint8
    assert image.min() < 100 and image.max() == 255  # an icon on white
    icons = {env.reset(seed).ground_truth["icon_id"] for seed in range(8)}
    assert len(icons) > 4


def test_turns_rewards_and_second_image(env: SvgEnv) -> None:
    env.reset(1)
    tr = env.step(svg_action(CRUDE_GRIN))
    assert tr.invalid_actions == [] and tr.actions_executed == 1
    assert 0.0 <= tr.reward < 0.9 and tr.reward == tr.info["score"]
    assert set(tr.info["score_parts"]) == {"pixel", "ssim", "edge"}
    assert not tr.terminated and not tr.truncated and not tr.success
    obs = tr.observation
    assert obs.text.count(IMAGE_PLACEHOLDER) == 2 and len(obs.images) == 2
    assert obs.ground_truth["turn"] == 1 and obs.ground_truth["last_score"] == pytest.approx(
        tr.reward, abs=1e-6
    )
    assert not np.array_equal(obs.images[0], obs.images[1])
    tr = env.step(svg_action(WRONG))
    assert tr.truncated and not tr.terminated and not tr.success  # max_turns = 2
    with pytest.raises(EnvError) as err:
        env.step(svg_action(WRONG))
    assert err.value.code == "FAILED_PRECONDITION"


def test_oracle_gets_maximum_score_and_success(env: SvgEnv) -> None:
    for seed in (0, 11):
        env.reset(seed)
        oracle = env.oracle_actions()
        assert len(oracle) == 1 and oracle[0].payload.lstrip().startswith("<svg")
        tr = env.step(oracle)
        assert tr.reward == 1.0 and tr.success and tr.terminated
        assert tr.info["score_parts"] == {"pixel": 1.0, "ssim": 1.0, "edge": 1.0}
        assert env.oracle_actions() == []


def test_score_ranks_blank_below_crude_below_exact() -> None:
    """The numbers (printed with -s) for the grinning face, 256x256, default weights."""
    limits = Limits()
    target = render_svg(grin_icon().source(), limits)
    scorer = OfflineScorer({"pixel": 0.4, "ssim": 0.3, "edge": 0.3})
    prepared = scorer.prepare(target)
    scores = {}
    for name, svg in {"blank": SVG.format(""), "wrong": WRONG, "crude": CRUDE_GRIN}.items():
        scores[name], parts = scorer.score(render_svg(svg, limits), prepared)
        print(name, round(scores[name], 3), {k: round(v, 3) for k, v in parts.items()})
    scores["exact"], _ = scorer.score(render_svg(grin_icon().source(), limits), prepared)
    print("exact", scores["exact"])
    assert scores["blank"] == 0.0
    assert scores["wrong"] < 0.15
    assert 0.6 < scores["crude"] < 0.95
    assert scores["exact"] == 1.0


def test_score_weights_are_configurable() -> None:
    env = SvgEnv(SvgConfig(score_weights={"edge": 1.0}))
    env.reset(1)
    tr = env.step(svg_action(CRUDE_GRIN))
    assert set(tr.info["score_parts"]) == {"edge"}
    assert tr.reward == pytest.approx(tr.info["score_parts"]["edge"])
    for bad in ({"edge": 0.0}, {"colour": 1.0}, {"pixel": -1.0, "ssim": 2.0}):
        with pytest.raises(EnvError) as err:
            SvgEnv(SvgConfig(score_weights=bad))
        assert err.value.code == "INVALID_ARGUMENT"


def test_success_threshold_is_configurable() -> None:
    env = SvgEnv(SvgConfig(success_threshold=0.05, max_turns=3))
    env.reset(1)
    tr = env.step(svg_action(CRUDE_GRIN))
    assert tr.success == (tr.reward >= 0.05)


def test_dreamsim_without_weights_is_a_clear_error(tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("VISENV_DREAMSIM_DIR", str(tmp_path))
    with pytest.raises(EnvError) as err:
        registry.make("svg", {"similarity": "dreamsim"})
    assert err.value.code == "UNAVAILABLE"
    assert str(tmp_path) in err.value.message
    assert "dreamsim_dir" in err.value.message and "VISENV_DREAMSIM_DIR" in err.value.message
    assert "dino_vitb16_lora" in err.value.message


def test_ground_truth_describe_and_prompt(env: SvgEnv) -> None:
    env.reset(2)
    state = env.ground_truth()
    assert set(state) >= {"icon_id", "description", "turn", "last_score"}
    natural = env.describe(state, Representation.NATURAL)
    assert state["icon_id"] in natural and "no SVG has been submitted" in natural
    assert f"icon={state['icon_id']}" in env.describe(state, Representation.SYMBOLIC)
    assert json.loads(env.describe(state, Representation.STRUCTURED)) == state
    assert SvgEnv.grading is None
    space = env.action_space
    assert space.kind is ActionKind.DOCUMENT and space.names == ("svg",) and space.max_per_turn == 1
    prompt = env.system_prompt(ResponseFormat.FREE_THINK)
    assert "SVG" in prompt and IMAGE_PLACEHOLDER not in prompt
    json.dumps(SvgConfig.model_json_schema())


# ---------------------------------------------------------------- invalid and hostile input
def assert_invalid_then_usable(env: SvgEnv, actions: list[Action], reason: str) -> None:
    """The answer is reported as invalid (never raised), and the session goes on."""
    env.reset(3)
    tr = env.step(actions)
    assert tr.actions_executed == 0 and tr.reward == 0.0 and not tr.done
    assert tr.invalid_actions and reason in tr.invalid_actions[0], tr.invalid_actions
    assert tr.info["render_error"] and tr.info["score"] is None
    assert tr.observation.text.count(IMAGE_PLACEHOLDER) == len(tr.observation.images) == 2
    assert (tr.observation.images[1] == 255).all()  # shown as an empty canvas
    tr = env.step(env.oracle_actions())
    assert tr.success and tr.reward == 1.0


@pytest.mark.parametrize(
    ("svg", "reason"),
    [
        ("", "no SVG document"),
        ("<svg><rect", "not well-formed"),
        ("<html/>", "not 'svg'"),
        (
            SVG.format('<image href="file:///etc/passwd" width="72" height="72"/>'),
            "file:///etc/passwd",
        ),
        (
            XSVG.format('<image xlink:href="/etc/hostname" width="72" height="72"/>'),
            "/etc/hostname",
        ),
        (
            SVG.format('<image href="http://127.0.0.1:9/x.png" width="9" height="9"/>'),
            "http://127.0.0.1",
        ),
        (SVG.format('<use href="other.svg#a"/>'), "other.svg#a"),
        (
            SVG.format('<image href="data:image/png;base64,AAAA" width="9" height="9"/>'),
            "data:image",
        ),
        (
            SVG.format('<rect width="9" height="9" style="fill: url(http://127.0.0.1:9/p)"/>'),
            "http://",
        ),
        (SVG.format("<style>@import url(file:///etc/passwd);</style>"), "@import"),
        (SVG.format("<style>rect { fill: url('file:///x') }</style>"), "file:///x"),
        (
            '<?xml version="1.0"?><!DOCTYPE svg [<!ENTITY x SYSTEM "file:///etc/passwd">]>'
            + SVG.format("<text>&x;</text>"),
            "DTD",
        ),
        (
            '<!DOCTYPE svg [<!ENTITY a "aaaaaaaaaa"><!ENTITY b "&a;&a;&a;&a;&a;&a;&a;&a;&a;&a;">'
            '<!ENTITY c "&b;&b;&b;&b;&b;&b;&b;&b;&b;&b;"><!ENTITY d "&c;&c;&c;&c;&c;&c;&c;&c;&c;&c;">]>'
            + SVG.format("<text>&d;&d;&d;&d;&d;&d;&d;&d;&d;&d;</text>"),
            "DTD",
        ),
        (SVG.format("<g>" * 100 + "</g>" * 100), "nests deeper than 64"),
        (SVG.format('<rect width="1" height="1"/>' * 20_000), "bytes; the limit"),
        (
            SVG.format(
                '<text x="9" y="60">&lt;image&gt; placeholder</text><image href="&lt;image&gt;"/>'
            ),
            "[image]",
        ),
    ],
    ids=[
        "empty",
        "malformed",
        "not-svg",
        "file-href",
        "xlink-relative-path",
        "http-href",
        "external-use",
        "data-uri",
        "css-url-attr",
        "css-import",
        "css-url-style",
        "xxe",
        "entity-bomb",
        "deep-nesting",
        "oversized",
        "placeholder-in-reason",
    ],
)
def test_hostile_or_invalid_svg_is_refused(env: SvgEnv, svg: str, reason: str) -> None:
    assert_invalid_then_usable(env, svg_action(svg), reason)


def test_malformed_actions_are_reported(env: SvgEnv) -> None:
    assert_invalid_then_usable(env, [], "no SVG document")
    assert_invalid_then_usable(env, [Action(name="Left")], "unknown action")
    assert_invalid_then_usable(env, [Action(name="svg", payload=None)], "no SVG document")
    env.reset(3)
    tr = env.step(svg_action(CRUDE_GRIN) + svg_action(WRONG))
    assert tr.actions_executed == 1 and len(tr.invalid_actions) == 1
    assert "over the limit of 1 actions per turn" in tr.invalid_actions[0]


def test_huge_width_and_height_are_clamped_to_the_canvas(env: SvgEnv) -> None:
    huge = '<svg xmlns="http://www.w3.org/2000/svg" width="1e12" height="1e12"><rect width="50%" height="50%" fill="red"/></svg>'
    image = render_svg(huge, Limits())
    assert image.shape == (256, 256, 3)
    assert (image[:128, :128] == [255, 0, 0]).all() and (image[128:, 128:] == 255).all()
    env.reset(3)
    assert env.step(svg_action(huge)).actions_executed == 1


def test_out_of_memory_render_is_refused_and_replaced(env: SvgEnv) -> None:
    bomb = SVG.format(
        '<defs><pattern id="p" width="100000" height="100000" patternUnits="userSpaceOnUse">'
        '<rect width="9" height="9"/></pattern></defs><rect width="72" height="72" fill="url(#p)"/>'
    )
    starts = renderer(env.limits.memory_mb).starts
    assert_invalid_then_usable(env, svg_action(bomb), "memory limit")
    assert renderer(env.limits.memory_mb).starts == starts + 1  # a fresh render process


def test_slow_render_times_out_and_session_goes_on() -> None:
    env = SvgEnv(SvgConfig(render_timeout_s=2.0))
    uses = "".join(
        f'<g id="a{i}">' + f'<use xlink:href="#a{i - 1}"/>' * 10 + "</g>" for i in range(1, 8)
    )
    slow = XSVG.format(
        f'<defs><path id="a0" d="M0 0L72 72" stroke="#000"/>{uses}</defs><use xlink:href="#a7"/>'
    )
    assert_invalid_then_usable(env, svg_action(slow), "longer than 2 s")


def test_render_process_refuses_fetches_even_unchecked() -> None:
    """Second line of defence: the child's url_fetcher refuses what the checks might miss."""
    unchecked = SVG.format('<image href="file:///etc/passwd" width="9" height="9"/>').encode()
    with pytest.raises(InvalidSvg, match="not allowed"):
        renderer(512).render(unchecked, 64, 64, timeout_s=10)
    imported = SVG.format("<style>@import 'file:///etc/passwd';</style>").encode()
    with pytest.raises(InvalidSvg, match="not allowed"):
        renderer(512).render(imported, 64, 64, timeout_s=10)


def test_render_process_that_died_is_replaced(env: SvgEnv) -> None:
    proc = renderer(env.limits.memory_mb)
    env.reset(5)
    assert proc._proc is not None
    os.kill(proc._proc.pid, signal.SIGKILL)
    proc._proc.wait()
    assert env.step(env.oracle_actions()).success


def test_check_svg_limits_are_configurable() -> None:
    doc = SVG.format('<rect width="1" height="1"/>' * 20)
    check_svg(doc, Limits())
    with pytest.raises(InvalidSvg, match="more than 10 elements"):
        check_svg(doc, Limits(max_elements=10))
    with pytest.raises(InvalidSvg, match="limit is 200"):
        check_svg(doc, Limits(max_bytes=200))


def test_world_model_grading_uses_the_description(env: SvgEnv) -> None:
    from env_server.reasoning.grading import grade_for_env, grading_state

    env.reset(0)
    truth = grading_state(env, env.ground_truth())
    rep = Representation.NATURAL
    assert grade_for_env(env, f"I see: {truth['description']}.", truth, rep) == 1.0
    grin = {"description": "grinning face"}
    assert grade_for_env(env, "A grinning face, yellow.", grin, rep) == 1.0
    assert grade_for_env(env, "a smiling face", grin, rep) == 0.5
    assert grade_for_env(env, "a cat", grin, rep) == 0.0
    # an icon without a description can't be graded: an error, never an unearned 0
    with pytest.raises(ValueError, match="no description"):
        grade_for_env(env, "anything", {"icon_id": "1FA8F", "description": None}, rep)


def test_end_to_end_through_a_real_server(start_visenv_server) -> None:
    """A memory bomb in a served session is an invalid action; the worker lives on."""
    bomb = SVG.format(
        '<defs><pattern id="p" width="100000" height="100000" patternUnits="userSpaceOnUse">'
        '<rect width="9" height="9"/></pattern></defs><rect width="72" height="72" fill="url(#p)"/>'
    )
    server = start_visenv_server(workers=1, envs="svg")
    with server.client() as http:
        reply = http.post("/v1/sessions", json={"env": "svg", "seed": 3, "format": "free_think"})
        assert reply.status_code == 200, reply.text
        created = reply.json()
        sid, truth = created["session_id"], created["observation"]["ground_truth"]
        assert len(created["observation"]["images"]) == 1
        response = f"<think>a bomb</think><answer>{bomb}</answer>"
        step = http.post(f"/v1/sessions/{sid}/step", json={"step_index": 0, "response": response})
        assert step.status_code == 200, step.text
        info = step.json()["info"]
        assert not info["action_valid"] and "memory limit" in info["invalid_actions"][0]
        assert step.json()["reward_parts"]["env"] == 0.0

        target = next(i for i in data.openmoji_icons() if i.id == truth["icon_id"]).source()
        response = f"<think>copy it</think><answer>```svg\n{target}\n```</answer>"
        step = http.post(f"/v1/sessions/{sid}/step", json={"step_index": 1, "response": response})
        assert step.status_code == 200, step.text
        body = step.json()
        assert body["success"] and body["reward_parts"]["env"] == 1.0
        assert len(body["observation"]["images"]) == 2
        health = http.get("/health").json()
        assert health["worker_restarts"] == 0 and all(w["alive"] for w in health["workers"])
