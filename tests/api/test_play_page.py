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
import shutil
from collections.abc import Iterator
from functools import partial
from pathlib import Path

import httpx
import pytest

from env_server.core.registry import make
from env_server.core.types import Action
from tests.conftest import VisenvServer, launch_server

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
    if os.environ.get("VISENV_SCREENSHOT_DIR"):
        for png in tmp_path.glob("*.png"):
            shutil.copy(png, os.environ["VISENV_SCREENSHOT_DIR"])


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
