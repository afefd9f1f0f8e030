"""The service hands world-model grading to the LLM judge when a session asks for it.

The judge is a real HTTP endpoint speaking the OpenAI chat-completions protocol,
served here by uvicorn on 127.0.0.1: it always says YES (or fails, for model "down").
"""

from __future__ import annotations

import asyncio

import pytest
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse

from env_server.service import EnvService, SessionReply, Settings
from env_server.service.models import ServiceError
from tests.conftest import serve_app

WRONG = (
    "<think><observation>The box is above the player.</observation><reasoning>r</reasoning>"
    "<prediction>The box is above the player.</prediction></think><answer>Up</answer>"
)


@pytest.fixture(scope="module")
def judge_url():
    app = FastAPI()
    app.state.calls = 0

    @app.post("/v1/chat/completions")
    async def chat(request: Request):
        body = await request.json()
        app.state.calls += 1
        if body["model"] == "down":
            return JSONResponse({"error": "refused"}, status_code=400)
        return {"choices": [{"message": {"role": "assistant", "content": "<answer>YES</answer>"}}]}

    with serve_app(app) as url:
        yield f"{url}/v1", app


def test_judge_scores_replace_rule_scores(judge_url):
    url, app = judge_url

    async def main():
        settings = Settings(workers=1, envs=["sokoban"], idle_timeout=0, judge_urls=[url])
        async with EnvService(settings) as service:
            judged = {
                "grader": "judge",
                "judge": {"base_url": url, "model": "yes", "max_retries": 0},
            }
            failing = {
                "grader": "judge",
                "judge": {"base_url": url, "model": "down", "max_retries": 0},
            }
            created = await service.create([
                {"env": "sokoban", "seed": 1, "reasoning": judged},
                {"env": "sokoban", "seed": 1},
                {"env": "sokoban", "seed": 1, "reasoning": failing},
            ])  # fmt: skip
            items = [
                {"session_id": r.session_id, "step_index": 0, "response": WRONG} for r in created
            ]
            return await service.step(items)

    by_judge, by_rule, failed = asyncio.run(main())
    assert all(isinstance(r, SessionReply) for r in (by_judge, by_rule, failed))
    assert by_rule.info["observation_score"] < 1.0  # the description is wrong
    assert by_judge.info["observation_score"] == 1.0 and by_judge.info["judge_error"] is None
    assert by_judge.reward_parts.observation == 0.5 and by_judge.reward_parts.prediction == 0.5
    assert by_judge.reward == pytest.approx(
        by_judge.reward_parts.env + by_judge.reward_parts.format + 1.0
    )
    assert "refused" in failed.info["judge_error"]  # a failed judge says so...
    assert failed.info["observation_score"] == by_rule.info["observation_score"]  # ...falls back
    assert app.state.calls >= 4


def test_judge_endpoints_are_the_operators_choice(judge_url):
    """A session can't make the server send requests (and its API key) anywhere."""
    url, app = judge_url

    async def main():
        settings = Settings(workers=1, envs=["sokoban"], idle_timeout=0, judge_urls=[url])
        async with EnvService(settings) as service:
            return await service.create([
                {"env": "sokoban", "reasoning": {"grader": "judge", "judge": {
                    "base_url": "http://169.254.169.254/latest", "model": "m"}}},
                {"env": "sokoban", "reasoning": {"grader": "judge", "judge": {
                    "base_url": url, "model": "m", "api_key_env": "VISENV_TOKEN"}}},
                {"env": "sokoban", "reasoning": {"grader": "judge", "judge": {
                    "base_url": url, "model": "m"}}},
            ])  # fmt: skip

    elsewhere, secret, allowed = asyncio.run(main())
    assert isinstance(elsewhere, ServiceError) and elsewhere.code == "INVALID_ARGUMENT"
    assert (
        elsewhere.field == "reasoning.judge.base_url" and "VISENV_JUDGE_URLS" in elsewhere.message
    )
    assert isinstance(secret, ServiceError) and secret.field == "reasoning.judge.api_key_env"
    assert isinstance(allowed, SessionReply)
