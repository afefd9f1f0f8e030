"""The REST steps' lean route (env_server/api/lean.py) answers every body exactly as the
FastAPI routes it bypasses (the single-session step and the batch step): the same status,
headers and JSON, the errors included.

In-process: the REST app over a real EnvService (one worker process), called through
httpx's ASGI transport. Each body goes to two twin sessions (same environment, same seed),
one with the lean route on and one with it off, so their states move in step.
"""

from __future__ import annotations

import json
import re

import httpx
import pytest

from env_server.api import lean
from env_server.api.rest import OffloadRequest, build_app
from env_server.service import EnvService, Settings
from env_server.testing import TINY_PATH, TinyEnv

TOKEN = "t"
AUTH = {"Authorization": f"Bearer {TOKEN}"}
# the guard against repeated responses off: each body goes to both twins
OPTIONS = {"env": "sokoban", "seed": 5, "format": "grounding_worldmodeling",
           "reasoning": {"guard": {"enabled": False}}}  # fmt: skip
GOOD = (
    "<think><observation>The box is above the player.</observation><reasoning>Push it."
    "</reasoning><prediction>The box is above the player.</prediction></think>"
    "<answer>Up</answer>"
)
# (body, headers): what clients send, the well-formed and the broken; `{i}`: the index the
# session expects next
BODIES: list[tuple[str | bytes, dict[str, str]]] = [
    ('{"step_index": {i}, "response": "' + GOOD + '"}', {}),
    ('{"step_index": {i}, "actions": [{"name": "Left"}]}', {}),
    ('{"step_index": 0, "actions": [{"name": "Left"}]}', {}),  # a repeated index: memory
    ('{"step_index": 99, "actions": [{"name": "Left"}]}', {}),  # ahead: refused
    ('{"step_index": {i}, "actions": [{"name": "Jump"}]}', {}),  # not an action
    ('{"step_index": {i}, "response": "x", "actions": [{"name": "Up"}]}', {}),  # both
    ('{"step_index": {i}}', {}),  # neither
    ('{"step_index": -1, "response": "x"}', {}),
    ('{"step_index": "1", "response": "x"}', {}),
    ('{"step_index": {i}, "response": "x", "extra": 1}', {}),
    ('{"step_index": {i}, "response": "x", "image_encoding": "gif"}', {}),
    ('{"step_index": {i}, "response": "x", "image_encoding": "raw"}', {}),
    ('{"step_index": {i}, "response": "\\ud800"}', {}),  # a lone surrogate escape
    ('{"step_index": {i}, "response": ' + "[" * 5000 + "]" * 5000 + "}", {}),  # deep
    ('{"step_index": {i}, "response": "' + "y" * 70_000 + '"}', {}),  # parsed in a thread
    ('{"step_index": {i}, ', {}),  # malformed
    ("null", {}),
    ("[]", {}),
    ("", {}),
    (b'{"step_index": 0, "response": "\xff"}', {}),  # not UTF-8
    ('{"step_index": {i}, "response": "<answer>Down</answer>"}', {"content-type": "text/plain"}),
    ('{"step_index": {i}, "actions": [{"name": "Right"}]}', {"Authorization": "Bearer no"}),
]


@pytest.fixture(scope="module")
def app(run):
    svc = EnvService(
        Settings(
            workers=1,
            envs=["sokoban", "tiny"],
            env_paths={TinyEnv.name: TINY_PATH},
            max_batch_items=8,
        )  # fmt: skip
    )
    run(svc.start())
    yield build_app(svc, token=TOKEN, max_request_bytes=1 << 20)
    run(svc.stop())


async def _call(
    app, sid: str, body: str | bytes, headers: dict[str, str], path: str = "/v1/sessions/{sid}/step"
) -> httpx.Response:
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app), base_url="http://t") as c:
        return await c.post(path.format(sid=sid), content=body,
                            headers={"content-type": "application/json", **AUTH, **headers})  # fmt: skip


def _same(one: httpx.Response, other: httpx.Response, sids: tuple[str, str]) -> None:
    assert one.status_code == other.status_code, (one.text[:300], other.text[:300])
    mine, theirs = json.loads(one.text.replace(sids[0], sids[1])), other.json()
    for body in (mine, theirs):  # an INTERNAL error's id differs from call to call
        if isinstance(body, dict) and body.get("error", {}).get("id"):
            body["error"]["id"] = "ID"
    assert mine == theirs


async def _sessions(app, n: int) -> list[str]:
    """`n` new sessions of OPTIONS (twins: the same level)."""
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app), base_url="http://t") as c:
        made = [(await c.post("/v1/sessions", json=OPTIONS, headers=AUTH)).json() for _ in range(n)]
    assert all(m["observation"] == made[0]["observation"] for m in made)
    return [m["session_id"] for m in made]


async def _both_ways(
    app, monkeypatch, sids, bodies, headers, path: str = "/v1/sessions/{sid}/step"
) -> httpx.Response:
    """`bodies[0]` to `sids[0]` through the lean route, `bodies[1]` to `sids[1]` through the
    FastAPI routes alone; the answers must match. Returns the lean route's."""
    fast = await _call(app, sids[0], bodies[0], headers, path)
    with monkeypatch.context() as m:
        m.setattr(lean, "STEP_PATH", re.compile(r"(?!)"))
        m.setattr(lean, "BATCH_PATH", "/nowhere")
        slow = await _call(app, sids[1], bodies[1], headers, path)
    _same(fast, slow, tuple(sids))
    return fast


def test_the_lean_route_answers_every_body_as_the_fastapi_route_does(run, app, monkeypatch):
    async def main():
        sids = await _sessions(app, 2)
        index = 0
        for body, headers in BODIES + [(b, h) for b, h in BODIES if "{i}" in str(b)][:4]:
            if isinstance(body, str):
                body = body.replace("{i}", str(index))
            fast = await _both_ways(app, monkeypatch, sids, (body, body), headers)
            if fast.status_code == 200:
                index = fast.json()["step_index"]
        # unknown sessions, and a session whose path needs decoding
        for sid in ("s-nope", "s%2Fnope"):
            body = '{"step_index": 0, "response": "x"}'
            fast = await _both_ways(app, monkeypatch, (sid, sid), (body, body), {})
            assert fast.json()["error"]["code"] in ("NOT_FOUND", "INVALID_ARGUMENT")

    run(main())


# batch bodies: `{sid}` is the twin's session, `{i}` the index it expects next
ITEM = '{"session_id": "{sid}", "step_index": {i}, "actions": [{"name": "Left"}]}'
BATCH_BODIES: list[tuple[str | bytes, dict[str, str]]] = [
    ('{"items": [' + ITEM + "]}", {}),
    ('{"items": [{"session_id": "{sid}", "step_index": {i}, "response": "' + GOOD + '"}]}', {}),
    ('{"items": [' + ITEM + ", " + ITEM + "]}", {}),  # one session twice: the second refused
    ('{"items": [' + ITEM + ', {"session_id": "s-nope", "step_index": 0, "response": "x"}]}', {}),
    ('{"items": [' + ITEM + ", 7]}", {}),  # an item that is not an object
    ('{"items": [' + ", ".join(["{}"] * 9) + "]}", {}),  # over max_batch_items (8)
    ('{"items": []}', {}),
    ('{"items": {}}', {}),
    ('{"items": [' + ITEM + '], "extra": 1}', {}),
    (
        '{"items": [{"session_id": "{sid}", "step_index": {i}, "response": "'
        + "y" * 70_000
        + '"}]}',
        {},
    ),
    ('{"items": [', {}),
    ("null", {}),
    ('{"items": [' + ITEM + "]}", {"content-type": "text/plain"}),
    ('{"items": [' + ITEM + "]}", {"Authorization": "Bearer no"}),
]


def test_the_lean_route_answers_every_batch_as_the_fastapi_route_does(run, app, monkeypatch):
    async def main():
        sids = await _sessions(app, 2)
        index = 0
        for template, headers in BATCH_BODIES:
            bodies = [template.replace("{sid}", sid).replace("{i}", str(index)) for sid in sids]
            fast = await _both_ways(app, monkeypatch, sids, bodies, headers, "/v1/batch/step")
            first = (fast.json().get("results") or [{}])[0] if fast.status_code == 200 else {}
            index = first.get("reply", {}).get("step_index", index)

    run(main())


def test_a_valid_step_skips_fastapis_body_parsing(run, app, monkeypatch):
    """The lean route is the one that answers a valid step, single or batch: FastAPI's body
    reading is not called for it, and is for a body the lean route hands on."""
    read = []
    parse = OffloadRequest.json

    async def counted(self):
        read.append(self.url.path)
        return await parse(self)

    async def main():
        (sid,) = await _sessions(app, 1)
        monkeypatch.setattr(OffloadRequest, "json", counted)
        ok = await _call(app, sid, '{"step_index": 0, "actions": [{"name": "Up"}]}', {})
        assert ok.status_code == 200 and ok.json()["step_index"] == 1
        assert read == []
        item = {"session_id": sid, "step_index": 1, "actions": [{"name": "Up"}]}
        ok = await _call(app, sid, json.dumps({"items": [item]}), {}, "/v1/batch/step")
        assert ok.json()["results"][0]["reply"]["step_index"] == 2
        assert read == []
        handed_on = await _call(app, sid, '{"step_index": 2}', {})
        assert handed_on.json()["error"]["code"] == "INVALID_ARGUMENT"
        handed_on = await _call(app, sid, '{"items": 3}', {}, "/v1/batch/step")
        assert handed_on.json()["error"]["code"] == "INVALID_ARGUMENT"
        assert read == [f"/v1/sessions/{sid}/step", "/v1/batch/step"]

    run(main())
