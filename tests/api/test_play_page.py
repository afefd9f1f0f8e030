"""The /play page in a real headless Chromium against a real `visenv serve`.

Plays a Sokoban episode to success with the oracle's moves (arrow keys and buttons),
sends a malformed raw response, steps a session that the server no longer has, presses
keys faster than the server answers (each press is one applied step), plays every
environment through the timeline at 1024x700, hides and shows the ground truth, opens an
episode file written by clients.episodes, and renders /docs with no internet.
With VISENV_SCREENSHOT_DIR set, the screenshots are copied there (docs/play/ holds them).
Needs Debian's `chromium` and `chromium-driver` (installed by `make setup`) and the
`selenium` package; it fails, never skips, when they are missing.
"""

from __future__ import annotations

import json
import os
import re
import shutil
from collections.abc import Iterator
from functools import partial
from pathlib import Path

import httpx
import pytest

from env_server.core.registry import make
from env_server.core.types import Action
from env_server.testing.launcher import VisenvServer, launch_server

CHROMIUM = os.environ.get("VISENV_CHROMIUM", "/usr/bin/chromium")
CHROMEDRIVER = os.environ.get("VISENV_CHROMEDRIVER", "/usr/bin/chromedriver")
SEED = 3
WAIT_S = 15
TOKEN = "play-token"


@pytest.fixture(scope="module")
def server() -> Iterator[VisenvServer]:
    """One real server with a token for this file's tests (the page must ask for it)."""
    server = launch_server(workers=1, envs="sokoban,frozenlake", token=TOKEN)
    yield server
    server.stop()


@pytest.fixture
def browser(tmp_path: Path) -> Iterator:
    missing = [p for p in (CHROMIUM, CHROMEDRIVER) if not shutil.which(p)]
    if missing:
        pytest.fail(f"headless Chromium is missing ({', '.join(missing)}): run `make setup` "
                    "(apt packages chromium chromium-driver)")  # fmt: skip
    try:
        from selenium import webdriver
        from selenium.webdriver.chrome.service import Service
    except ImportError:
        pytest.fail("selenium is missing: run `make setup` (the dev extra)")
    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for flag in ("--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                 "--disable-background-networking", "--disable-component-update",
                 "--disable-sync", "--window-size=1024,700",
                 f"--user-data-dir={tmp_path / 'chromium-profile'}"):  # fmt: skip
        options.add_argument(flag)
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    driver = webdriver.Chrome(options=options, service=Service(CHROMEDRIVER))
    driver.set_page_load_timeout(WAIT_S)
    try:
        yield driver
    finally:
        driver.quit()


def wait_for(driver, condition, what: str):
    from selenium.common.exceptions import TimeoutException
    from selenium.webdriver.support.ui import WebDriverWait

    try:
        return WebDriverWait(driver, WAIT_S, poll_frequency=0.05).until(condition)
    except TimeoutException:
        pytest.fail(f"the page never showed {what}; status: {d_text(driver, 'status')!r}")


def d_text(driver, element_id: str) -> str:
    return driver.execute_script(f"return document.getElementById('{element_id}').textContent")


def shown_step(driver) -> int | None:
    sid = d_text(driver, "sid")
    return int(sid.rsplit("step ", 1)[1]) if "step " in sid else None


def shown_images(driver) -> list[int]:
    """The natural widths of the images in the large view (0: one that did not load)."""
    return driver.execute_script(
        "return [...document.querySelectorAll('#view img')].map(i => i.complete && i.naturalWidth)"
    )


def shown_ground_truth(driver) -> dict:
    lines = d_text(driver, "gt").splitlines()
    return {k: json.loads(v) for k, v in (line.split(": ", 1) for line in lines)}


def act_and_wait(driver, do, step_before: int) -> None:
    do()
    wait_for(driver, lambda d: shown_step(d) == step_before + 1, f"step {step_before + 1}")


def js_errors(driver) -> list[str]:
    """Console errors other than the failed fetches the test provokes on purpose."""
    return [e["message"] for e in driver.get_log("browser")
            if e["level"] == "SEVERE" and "Failed to load resource" not in e["message"]]  # fmt: skip


def test_play_page_plays_sokoban_to_success(server, browser, tmp_path: Path) -> None:
    from selenium.webdriver.common.by import By
    from selenium.webdriver.common.keys import Keys
    from selenium.webdriver.support.ui import Select

    driver = browser
    driver.get(server.url + "/play")
    driver.find_element(By.ID, "token").send_keys(TOKEN, Keys.TAB)
    wait_for(driver, lambda d: d.find_elements(By.CSS_SELECTOR, "#env option[value=sokoban]"),
             "the sokoban option")  # fmt: skip
    Select(driver.find_element(By.ID, "env")).select_by_value("sokoban")
    Select(driver.find_element(By.ID, "format")).select_by_visible_text("grounding_worldmodeling")
    seed = driver.find_element(By.ID, "seed")
    seed.clear()
    seed.send_keys(str(SEED))
    driver.find_element(By.ID, "create").click()
    wait_for(driver, lambda d: shown_step(d) == 0, "a new session at step 0")

    assert shown_images(driver) == [96], "the frame image is not displayed"
    button = driver.find_element(By.CSS_SELECTOR, "#actions button")
    assert button.rect["y"] + button.rect["height"] <= driver.execute_script(
        "return window.innerHeight"
    ), "the action buttons are below the fold at 1024x700"  # fmt: skip
    buttons = {b.get_attribute("data-action"): b
               for b in driver.find_elements(By.CSS_SELECTOR, "#actions button")}  # fmt: skip
    assert set(buttons) == {"Up", "Down", "Left", "Right"}
    assert "Sokoban" in driver.execute_script(
        "return document.getElementById('prompt').textContent"
    )

    env = make("sokoban")
    env.reset(SEED)
    assert shown_ground_truth(driver)["player"] == env.ground_truth()["player"]
    keys = {"Up": Keys.ARROW_UP, "Down": Keys.ARROW_DOWN, "Left": Keys.ARROW_LEFT,
            "Right": Keys.ARROW_RIGHT}  # fmt: skip
    body = driver.find_element(By.TAG_NAME, "body")
    moves = 0
    success = False
    while not success:
        assert moves < 40, "the oracle did not finish the level"
        for action in env.oracle_actions():
            step = shown_step(driver)
            assert step is not None
            if moves % 2 == 0:  # half by arrow key, half by button
                act_and_wait(driver, partial(body.send_keys, keys[action.name]), step)
            else:
                act_and_wait(driver, buttons[action.name].click, step)
            transition = env.step([action])
            moves += 1
            if moves == 1:
                driver.save_screenshot(str(tmp_path / "play-page.png"))
            assert shown_ground_truth(driver) == env.ground_truth()
            reward = driver.find_element(By.ID, "reward").text
            assert f"{transition.reward:.3f}" in reward, reward
            success = transition.terminated
            if success:
                break
    wait_for(driver, lambda d: "episode over: success" in d_text(d, "status"), "success")
    assert all(not b.is_enabled() for b in buttons.values())
    assert driver.execute_script("return document.documentElement.scrollWidth") <= 1024, (
        "the page scrolls sideways at 1024x700"
    )
    driver.save_screenshot(str(tmp_path / "play-page-success.png"))

    # A malformed raw response is graded, not fatal: the page shows the parse error.
    driver.find_element(By.ID, "reset").click()
    wait_for(driver, lambda d: shown_step(d) == 0 and "episode 1" in d_text(d, "sid"), "reset")
    assert d_text(driver, "where").startswith(f"seed {SEED} · episode 1 · turn 0/")  # same seed
    assert len(timeline(driver)) == 1  # a new episode starts a new timeline
    response = driver.find_element(By.ID, "response")
    response.send_keys("Left please, no tags")
    act_and_wait(driver, driver.find_element(By.ID, "send").click, 0)
    status = d_text(driver, "status")
    assert "invalid response" in status and "missing <think>" in status, status
    assert "action_valid: false" in d_text(driver, "info")
    driver.save_screenshot(str(tmp_path / "play-page-parse-error.png"))
    act_and_wait(driver, lambda: body.send_keys(Keys.ARROW_DOWN), 1)  # still playable
    assert "action_valid: true" in d_text(driver, "info")

    # The server forgets the session (closed or expired): the page says so readably.
    session_id = d_text(driver, "sid").split(" ")[0]
    assert (
        httpx.delete(f"{server.url}/v1/sessions/{session_id}", headers=server.headers).status_code
        == 200
    )
    body.send_keys(Keys.ARROW_UP)
    wait_for(driver, lambda d: "NOT_FOUND" in d_text(d, "status"), "the unknown-session error")
    assert session_id in d_text(driver, "status")
    assert shown_step(driver) == 2  # the last good reply stays on screen
    driver.save_screenshot(str(tmp_path / "play-page-not-found.png"))
    assert js_errors(driver) == []


def test_play_page_asks_for_the_token(server, browser) -> None:
    from selenium.webdriver.common.by import By
    from selenium.webdriver.common.keys import Keys
    from selenium.webdriver.support.ui import Select

    driver = browser
    driver.get(server.url + "/play")
    wait_for(driver, lambda d: "UNAUTHENTICATED" in d_text(d, "status"), "the token error")
    assert "enter the server's token" in d_text(driver, "status")
    driver.find_element(By.ID, "token").send_keys(TOKEN, Keys.TAB)
    wait_for(driver, lambda d: d.find_elements(By.CSS_SELECTOR, "#env option[value=frozenlake]"),
             "the env list once the token is given")  # fmt: skip
    assert d_text(driver, "status") == ""
    Select(driver.find_element(By.ID, "env")).select_by_value("frozenlake")
    driver.find_element(By.ID, "create").click()
    wait_for(driver, lambda d: shown_step(d) == 0, "a new session at step 0")
    assert "FrozenLake" in driver.execute_script(
        "return document.getElementById('prompt').textContent"
    )
    body = driver.find_element(By.TAG_NAME, "body")
    act_and_wait(driver, partial(body.send_keys, "1"), 0)  # key 1: the first action, Left
    assert '"name":"Left"' in d_text(driver, "info")
    assert js_errors(driver) == []


def timeline(driver) -> list:
    from selenium.webdriver.common.by import By

    return driver.find_elements(By.CSS_SELECTOR, "#timeline .turn")


def open_page(driver, server, env: str, seed: int, config: str = "{}", token: str = "") -> None:
    """Load /play and create a session of `env` at `seed`."""
    from selenium.webdriver.common.by import By
    from selenium.webdriver.common.keys import Keys
    from selenium.webdriver.support.ui import Select

    if not driver.current_url.endswith("/play"):
        driver.get(server.url + "/play")
    if token:
        driver.find_element(By.ID, "token").send_keys(token, Keys.TAB)
    wait_for(driver, lambda d: d.find_elements(By.CSS_SELECTOR, f"#env option[value={env}]"),
             f"the {env} option")  # fmt: skip
    Select(driver.find_element(By.ID, "env")).select_by_value(env)
    for field, value in (("seed", str(seed)), ("config", config)):
        box = driver.find_element(By.ID, field)
        box.clear()
        box.send_keys(value)
    before = d_text(driver, "sid")
    driver.find_element(By.ID, "create").click()
    wait_for(driver, lambda d: d_text(d, "sid") != before and shown_step(d) == 0,
             f"a new {env} session")  # fmt: skip


def test_fast_key_presses_are_each_one_applied_step(server, browser) -> None:
    """Presses sent faster than the server answers queue: n presses, n applied moves,
    and the return is the sum of the rewards the server gave for them."""
    from selenium.webdriver.common.by import By
    from selenium.webdriver.common.keys import Keys

    driver = browser
    open_page(driver, server, "frozenlake", 5, '{"max_turns": 20}', token=TOKEN)
    body = driver.find_element(By.TAG_NAME, "body")
    presses = [Keys.ARROW_DOWN, Keys.ARROW_RIGHT, Keys.ARROW_UP, Keys.ARROW_LEFT, Keys.ARROW_DOWN]
    body.send_keys(*presses)  # one burst: all five before the first reply
    env = make("frozenlake", {"max_turns": 20})
    env.reset(5)
    names = {Keys.ARROW_DOWN: "Down", Keys.ARROW_RIGHT: "Right", Keys.ARROW_UP: "Up",
             Keys.ARROW_LEFT: "Left"}  # fmt: skip
    applied = []
    for key in presses:
        transition = env.step([Action(names[key])])
        applied.append(transition)
        if transition.terminated or transition.truncated:
            break
    wait_for(driver, lambda d: shown_step(d) == len(applied), f"{len(applied)} applied steps")
    wait_for(driver, lambda d: "in flight" not in d_text(d, "inflight"), "the queue drained")
    assert len(timeline(driver)) == len(applied) + 1
    assert shown_ground_truth(driver) == env.ground_truth()
    expected = sum(t.reward for t in applied)
    assert f"return {expected:.3f}" in d_text(driver, "where"), d_text(driver, "where")
    acts = [c.find_element(By.CLASS_NAME, "act").text for c in timeline(driver)[1:]]
    assert acts == [names[k] for k in presses[: len(applied)]]
    assert js_errors(driver) == []


@pytest.fixture(scope="module")
def every_env_server() -> Iterator[VisenvServer]:
    """A server with every environment (no token): one worker, so one pre-warm."""
    server = launch_server(workers=1, envs=",".join(PLAYS), timeout=240)
    yield server
    server.stop()


def shoot(driver, tmp_path: Path, name: str) -> None:
    """A screenshot, kept small (a 256-colour palette); copied to VISENV_SCREENSHOT_DIR."""
    from PIL import Image

    path = tmp_path / f"{name}.png"
    driver.save_screenshot(str(path))
    with Image.open(path) as im:
        im.convert("RGB").quantize(256).save(path, optimize=True)
    if os.environ.get("VISENV_SCREENSHOT_DIR"):
        shutil.copy(path, os.environ["VISENV_SCREENSHOT_DIR"])


# per env: how the test plays one turn (a key, or "template": fill the template and send)
PLAYS = {"sokoban": "1", "frozenlake": "1", "navigation": "1", "primitive_skill": "template",
         "svg": "template", "vicrit": "template"}  # fmt: skip


def test_every_environment_plays_through_the_timeline(every_env_server, browser, tmp_path) -> None:
    from selenium.webdriver.common.by import By

    driver = browser
    server = every_env_server
    available = {e["name"] for e in httpx.get(f"{server.url}/v1/envs").json()["envs"]
                 if e["available"] and e["enabled"]}  # fmt: skip
    assert available == set(PLAYS), "every environment must run here for this test"
    for env, play in PLAYS.items():
        open_page(driver, server, env, 2, '{"max_turns": 3}' if env == "navigation" else "{}")
        body = driver.find_element(By.TAG_NAME, "body")
        assert len(timeline(driver)) == 1
        assert all(w > 0 for w in shown_images(driver)) and shown_images(driver)
        where = d_text(driver, "where")
        assert where.startswith("seed 2 · episode 0 · turn 0/"), where
        placeholder = driver.find_element(By.ID, "response").get_attribute("placeholder")
        assert placeholder.startswith("<think><observation>") and "</answer>" in placeholder
        gt_hidden = "hidden" in driver.find_element(By.ID, "gt").get_attribute("class")
        assert gt_hidden == (env == "vicrit"), f"{env}: the answer-holding pane starts hidden"
        if play == "template":
            driver.find_element(By.ID, "template").click()
            assert driver.find_element(By.ID, "response").get_attribute("value") == placeholder
            driver.find_element(By.ID, "send").click()
        else:
            body.send_keys(play)
        wait_for(driver, lambda d: shown_step(d) == 1, f"{env}: the first step")
        assert len(timeline(driver)) == 2
        if env == "primitive_skill":  # the template picks the first listed object: it is there
            assert "no object to pick" not in d_text(driver, "status") + d_text(driver, "info")
            info = d_text(driver, "info")
            assert "invalid_actions: []" in info and "actions_executed: 2" in info, info
        if env == "svg":  # target and the agent's rendering, side by side, large and small
            assert len(shown_images(driver)) == 2 and all(shown_images(driver))
            thumbs = timeline(driver)[1].find_elements(By.CSS_SELECTOR, ".thumbs canvas")
            assert [t.get_attribute("title") for t in thumbs] == ["target", "agent's rendering"]
        if env == "vicrit":
            driver.find_element(By.ID, "gt-toggle").click()
            assert (
                "caption" in d_text(driver, "gt")
                and driver.find_element(By.ID, "gt").is_displayed()
            )
            driver.find_element(By.ID, "gt-toggle").click()
            assert not driver.find_element(By.ID, "gt").is_displayed()
        assert not re.search(r"\d\.\d{4,}", d_text(driver, "gt")), "numbers are rounded"
        shoot(driver, tmp_path, env)
        # the first turn, clicked, is shown large again
        timeline(driver)[0].click()
        assert "viewing turn 0 of 1" in d_text(driver, "viewing")
        timeline(driver)[1].click()
        assert d_text(driver, "viewing") == ""

    # a text observation replaces the previous session's frame (no stale image)
    open_page(driver, server, "frozenlake", 2, '{"render_mode": "text"}')
    assert shown_images(driver) == []
    assert "text only" in d_text(driver, "view")
    assert js_errors(driver) == []


def test_frame_png_after_an_svg_step_is_the_agents_rendering(every_env_server) -> None:
    import io

    from PIL import Image

    with every_env_server.client() as c:
        sid = c.post("/v1/sessions", json={"env": "svg", "seed": 2, "format": "no_think"}).json()[
            "session_id"
        ]
        red = '<svg xmlns="http://www.w3.org/2000/svg" width="10" height="10"><rect width="10" height="10" fill="#f00"/></svg>'
        reply = c.post(f"/v1/sessions/{sid}/step",
                       json={"step_index": 0, "response": f"<answer>{red}</answer>"}).json()  # fmt: skip
        assert len(reply["observation"]["images"]) == 2
        frame = Image.open(io.BytesIO(c.get(f"/v1/sessions/{sid}/frame.png").content))
        assert frame.convert("RGB").getpixel((frame.width // 2, frame.height // 2)) == (255, 0, 0)


def test_an_episode_file_replays_in_the_timeline(server, browser, tmp_path) -> None:
    """Episodes played by the SDK, written by clients.episodes (what `visenv eval --out`
    and the trainer write), open in the page and step through the same timeline."""
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import Select

    from clients import EnvClient
    from clients.episodes import read_episodes, write_episodes

    env = make("sokoban")

    def oracle(batch):  # the oracle's moves for each episode's current state
        out = []
        for p in batch:
            env.reset(p.seed)
            for t in p.history:
                env.step([Action(n.strip()) for n in
                          t.response.split("<answer>")[1].split("</answer>")[0].split(",")])  # fmt: skip
            names = ", ".join(a.name for a in env.oracle_actions()[:1])
            answer = names if p.turn != 1 else "nonsense"
            out.append(f"<think>the oracle says {answer}</think><answer>{answer}</answer>")
        return out

    with EnvClient([server.grpc], token=TOKEN) as client:
        trajs = client.run_episodes(oracle, "sokoban", seeds=[SEED, SEED + 1], format="free_think",
                                    max_turns=4, progress=False)  # fmt: skip
    path = tmp_path / "episodes.jsonl"
    assert write_episodes(path, trajs) == 2
    episodes = list(read_episodes(path))
    assert [e["seed"] for e in episodes] == [SEED, SEED + 1]
    assert all(e["steps"][0]["observation"]["images"][0]["encoding"] == "png" for e in episodes)

    driver = browser
    driver.get(server.url + "/play")  # no token: a replay needs no server
    wait_for(driver, lambda d: "UNAUTHENTICATED" in d_text(d, "status"), "the env list refused")
    driver.find_element(By.ID, "episode-file").send_keys(str(path))
    wait_for(driver, lambda d: d_text(d, "where").startswith("replay of episodes.jsonl"),
             "the replayed episode")  # fmt: skip
    first = episodes[0]
    assert len(timeline(driver)) == first["turns"] + 1
    acts = [c.find_element(By.CLASS_NAME, "act").text for c in timeline(driver)]
    answers = [s["response"].split("<answer>")[1].split("</answer>")[0] for s in first["steps"]]
    assert acts == ["start", *answers]
    assert "invalid" in timeline(driver)[2].text  # turn 2 answered nonsense
    assert all(shown_images(driver))
    assert f"return {first['return']:.3f}" in d_text(driver, "where")
    assert "success" in d_text(driver, "status") and "UNAUTHENTICATED" not in d_text(
        driver, "status"
    )
    # a turn shows what the agent saw before it (large) and what it wrote, by tag
    timeline(driver)[2].click()
    assert "viewing turn 2" in d_text(driver, "viewing")
    assert shown_ground_truth(driver) == first["steps"][1]["observation"]["ground_truth"]
    captions = [c.text for c in driver.find_elements(By.CSS_SELECTOR, "#view figcaption")]
    assert captions == ["seen before turn 2", "after turn 2"], captions
    sent = d_text(driver, "sent")
    assert "think" in sent and "the oracle says nonsense" in sent and "answer" in sent, sent
    assert "not parsed" in sent, sent  # turn 2 answered nonsense
    shoot(driver, tmp_path, "replay_turn")
    timeline(driver)[1].click()
    assert "viewing turn 1" in d_text(driver, "viewing")
    assert shown_ground_truth(driver) == first["steps"][0]["observation"]["ground_truth"]
    assert "moved" in d_text(driver, "sent") or "blocked" in d_text(driver, "sent")
    assert driver.find_element(By.ID, "send").get_attribute("disabled") is not None
    shoot(driver, tmp_path, "replay")
    Select(driver.find_element(By.ID, "replay-pick")).select_by_index(1)
    assert f"seed {SEED + 1}" in d_text(driver, "where")
    assert len(timeline(driver)) == episodes[1]["turns"] + 1
    assert js_errors(driver) == []


def test_docs_render_offline(server, browser, tmp_path) -> None:
    """/docs (Swagger UI) loads every file from this server (fastapi-offline's copies),
    none from a CDN, and shows the API's operations."""
    from selenium.webdriver.common.by import By

    driver = browser
    driver.get(server.url + "/docs")
    wait_for(driver, lambda d: len(d.find_elements(By.CSS_SELECTOR, ".opblock")) > 10,
             "Swagger UI's operations")  # fmt: skip
    resources = driver.execute_script(
        "return performance.getEntriesByType('resource').map(e => e.name)"
    )
    assert any(r.endswith("swagger-ui-bundle.js") for r in resources), resources
    assert all(r.startswith(server.url) for r in resources), resources
    summaries = " ".join(e.text for e in driver.find_elements(By.CSS_SELECTOR, ".opblock-summary"))
    assert "/v1/sessions/{session_id}/step" in summaries
    # "Try it out" on POST /v1/sessions starts from the model's example, not a made-up body
    create = next(b for b in driver.find_elements(By.CSS_SELECTOR, ".opblock-post")
                  if b.find_element(By.CSS_SELECTOR, ".opblock-summary-path").text == "/v1/sessions")  # fmt: skip
    create.find_element(By.CSS_SELECTOR, ".opblock-summary").click()
    wait_for(driver, lambda d: create.find_elements(By.CSS_SELECTOR, ".try-out__btn"), "Try it out")
    create.find_element(By.CSS_SELECTOR, ".try-out__btn").click()
    wait_for(driver, lambda d: create.find_elements(By.CSS_SELECTOR, "textarea.body-param__text"),
             "the request body")  # fmt: skip
    body = json.loads(
        create.find_element(By.CSS_SELECTOR, "textarea.body-param__text").get_attribute("value")
    )
    assert body == {"env": "sokoban", "seed": 7, "format": "no_think", "config": {}}, body
    shoot(driver, tmp_path, "docs")
    redoc = httpx.get(server.url + "/redoc", headers=server.headers)
    assert redoc.status_code == 404  # ReDoc would fetch from a CDN: not served
    assert js_errors(driver) == []


def test_a_double_click_on_create_makes_one_session(server, browser) -> None:
    from selenium.webdriver.common.action_chains import ActionChains
    from selenium.webdriver.common.by import By
    from selenium.webdriver.common.keys import Keys

    def sessions() -> int:
        return httpx.get(f"{server.url}/health", headers=server.headers).json()["sessions"]

    driver = browser
    driver.get(server.url + "/play")
    driver.find_element(By.ID, "token").send_keys(TOKEN, Keys.TAB)
    wait_for(driver, lambda d: d.find_elements(By.CSS_SELECTOR, "#env option[value=sokoban]"),
             "the env list")  # fmt: skip
    before = sessions()
    create = driver.find_element(By.ID, "create")
    ActionChains(driver).double_click(create).perform()
    wait_for(driver, lambda d: shown_step(d) == 0, "the new session")
    wait_for(driver, lambda d: create.is_enabled(), "create enabled again")
    assert sessions() == before + 1


def session_header(driver) -> str:
    return d_text(driver, "session")


def test_the_page_stays_bound_to_its_session(server, browser, tmp_path) -> None:
    """Controls changed after create say "create to apply" and never re-target reset,
    send or the template: they act on the live session, which the header names."""
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import Select

    driver = browser
    driver.get(server.url + "/play")
    Select(driver.find_element(By.ID, "format")).select_by_visible_text("no_think")
    open_page(driver, server, "sokoban", SEED, token=TOKEN)
    sid = d_text(driver, "sid").split(" ")[0]
    header = session_header(driver)
    assert (
        header
        == f"session: sokoban · format no_think · representation natural · config {{}} · seed {SEED}"
    )
    assert d_text(driver, "pending") == ""

    Select(driver.find_element(By.ID, "env")).select_by_value("frozenlake")
    Select(driver.find_element(By.ID, "format")).select_by_visible_text("free_think")
    pending = d_text(driver, "pending")
    assert "env frozenlake" in pending and "format free_think" in pending, pending
    assert "press create to apply" in pending and "this sokoban session" in pending
    shoot(driver, tmp_path, "controls_pending")

    driver.find_element(By.ID, "reset").click()  # resets the sokoban session, and says so
    wait_for(driver, lambda d: "episode 1" in d_text(d, "sid"), "the reset")
    assert d_text(driver, "sid").split(" ")[0] == sid and session_header(driver) == header
    assert set(b.get_attribute("data-action") for b in
               driver.find_elements(By.CSS_SELECTOR, "#actions button")) == {"Up", "Down", "Left", "Right"}  # fmt: skip

    # "fill template" writes the session's format (no_think), not the dropdown's
    driver.find_element(By.ID, "template").click()
    template = driver.find_element(By.ID, "response").get_attribute("value")
    assert template == "<answer>Up, Down</answer>", template
    act_and_wait(driver, driver.find_element(By.ID, "send").click, 0)
    assert "action_valid: true" in d_text(driver, "info"), d_text(driver, "status")
    assert js_errors(driver) == []


def test_a_failed_create_leaves_no_session_to_drive(server, browser, tmp_path) -> None:
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import Select

    driver = browser
    open_page(driver, server, "frozenlake", 1, '{"text_as": "structured"}', token=TOKEN)
    old = d_text(driver, "sid").split(" ")[0]
    Select(driver.find_element(By.ID, "env")).select_by_value("sokoban")
    driver.find_element(By.ID, "create").click()  # the frozenlake config is left over
    wait_for(driver, lambda d: "INVALID_ARGUMENT" in d_text(d, "status"), "the refused create")
    assert "text_as" in d_text(driver, "status")
    assert session_header(driver) == "no session"
    assert d_text(driver, "where") == "no session: the create failed"
    assert driver.find_elements(By.CSS_SELECTOR, "#actions button") == []
    assert driver.find_element(By.ID, "send").get_attribute("disabled") is not None
    assert driver.find_element(By.ID, "reset").get_attribute("disabled") is not None
    assert timeline(driver) == []
    # the old session is closed, not left behind
    wait_for(driver, lambda d: httpx.get(f"{server.url}/v1/sessions/{old}",
                                         headers=server.headers).status_code == 404,
             "the old session closed")  # fmt: skip
    shoot(driver, tmp_path, "failed_create")
    assert js_errors(driver) == []


def test_several_moves_make_one_turn(server, browser, tmp_path) -> None:
    """With "several moves a turn", presses queue into the turn being built and go as one
    step, as an agent's do; the card says what each move did."""
    from selenium.webdriver.common.by import By
    from selenium.webdriver.common.keys import Keys

    driver = browser
    open_page(driver, server, "sokoban", SEED, token=TOKEN)
    driver.find_element(By.ID, "multi").click()
    body = driver.find_element(By.TAG_NAME, "body")
    env = make("sokoban")
    env.reset(SEED)
    plan = [a.name for a in env.oracle_actions()][:2] + ["Left"]
    keys = {"Up": Keys.ARROW_UP, "Down": Keys.ARROW_DOWN, "Left": Keys.ARROW_LEFT,
            "Right": Keys.ARROW_RIGHT}  # fmt: skip
    body.send_keys(*[keys[n] for n in plan])
    assert d_text(driver, "moves") == f"this turn: {', '.join(plan)} (3/3)"
    body.send_keys(Keys.ARROW_UP)  # a fourth is refused: the turn is full
    assert "at most 3 moves" in d_text(driver, "moves")
    assert shown_step(driver) == 0
    act_and_wait(driver, lambda: body.send_keys(Keys.ENTER), 0)
    transition = env.step([Action(n) for n in plan])
    assert shown_ground_truth(driver) == env.ground_truth()
    assert len(timeline(driver)) == 2
    card = timeline(driver)[1]
    assert card.find_element(By.CLASS_NAME, "act").text == ", ".join(plan)
    expected = " · ".join(f"{a['name']} {a['result']}" + (f" (box {a['box']})" if "box" in a else "")
                          for a in transition.info["actions"])  # fmt: skip
    assert card.find_element(By.CLASS_NAME, "results").text == expected
    assert f"{transition.reward:.3f}" in d_text(driver, "reward")
    assert d_text(driver, "moves") == ""
    shoot(driver, tmp_path, "several_moves")
    assert js_errors(driver) == []


def test_frames_are_scaled_up_crisply_and_thumbnails_show_the_change(server, browser) -> None:
    from selenium.webdriver.common.by import By
    from selenium.webdriver.common.keys import Keys

    driver = browser
    open_page(driver, server, "sokoban", SEED, token=TOKEN)
    img = driver.find_element(By.CSS_SELECTOR, "#view img")
    wait_for(driver, lambda d: img.size["height"] >= 3 * 96, "the frame at 3x")
    assert img.value_of_css_property("image-rendering") == "pixelated"
    act_and_wait(
        driver, lambda: driver.find_element(By.TAG_NAME, "body").send_keys(Keys.ARROW_LEFT), 0
    )
    canvas = timeline(driver)[1].find_element(By.CSS_SELECTOR, ".thumbs canvas")
    wait_for(driver, lambda d: canvas.get_attribute("data-changed"), "the changed box")
    x0, y0, x1, y1 = map(int, canvas.get_attribute("data-changed").split(","))
    assert 0 < (x1 - x0 + 1) * (y1 - y0 + 1) <= 2 * 16 * 16 * 2  # one or two tiles: the move


def test_primitive_skill_by_clicks(every_env_server, browser, tmp_path) -> None:
    """A click on an object in the image writes its position (from the listed positions,
    under the camera the observation names); the picked object is then held."""
    from selenium.webdriver.common.action_chains import ActionChains
    from selenium.webdriver.common.by import By

    driver = browser
    open_page(driver, every_env_server, "primitive_skill", 4)
    gt = shown_ground_truth(driver)
    name, position = next(iter(gt["objects"].items()))
    img = driver.find_element(By.CSS_SELECTOR, "#view figure.seen img")
    wait_for(driver, lambda d: img.size["width"] > 0, "the image")
    cam = driver.execute_script("return entries[entries.length - 1].after.info.camera")
    px, py = driver.execute_script("return project(arguments[0], arguments[1])", cam, position)
    scale = img.size["width"] / cam["size_px"]
    box = driver.find_element(By.ID, "response")
    box.send_keys("pick(")
    ActionChains(driver).move_to_element_with_offset(
        img, px * scale - img.size["width"] / 2, py * scale - img.size["height"] / 2
    ).click().perform()
    box.send_keys(")")
    written = ", ".join(str(round(v)) for v in position)
    assert box.get_attribute("value") == f"pick({written})"
    assert f"the {name.replace('_', ' ')}" in d_text(driver, "clicked")
    shoot(driver, tmp_path, "primitive_skill_click")
    driver.find_element(By.ID, "response").clear()
    driver.find_element(By.ID, "response").send_keys(
        f"<think><observation>.</observation><reasoning>.</reasoning><prediction>.</prediction></think><answer>pick({written})</answer>"
    )
    act_and_wait(driver, driver.find_element(By.ID, "send").click, 0)
    assert shown_ground_truth(driver)["holding"] == name, d_text(driver, "info")
    assert js_errors(driver) == []


def test_vicrit_ends_with_the_right_span_and_the_score(every_env_server, browser, tmp_path) -> None:
    from selenium.webdriver.common.by import By

    driver = browser
    open_page(driver, every_env_server, "vicrit", 2)
    driver.find_element(By.ID, "template").click()
    act_and_wait(driver, driver.find_element(By.ID, "send").click, 0)
    wait_for(driver, lambda d: "episode over" in d_text(d, "status"), "the end")
    env = make("vicrit")
    env.reset(2)
    span = env.ground_truth()["span"]
    status = d_text(driver, "status")
    assert f"the wrong span was “{span}”" in status and "score 0.000" in status, status
    obs = d_text(driver, "obs")
    assert f"The wrong span was {span!r}" in obs and "Score: 0" in obs, obs
    assert "one document" not in d_text(driver, "prompt") + obs
    shoot(driver, tmp_path, "vicrit_end")
    assert js_errors(driver) == []


def test_no_favicon_404(server) -> None:
    reply = httpx.get(f"{server.url}/favicon.ico")
    assert reply.status_code == 200 and reply.headers["content-type"].startswith("image/svg+xml")
