"""One contract, two `SessionService`s: a real `visenv serve` (EnvService) and a real
gateway in front of a real server (GatewayService) answer every case below the same,
over REST and over gRPC: the same replies, and the same errors with the same codes,
fields and messages (session ids aside, which name different sessions)."""

from __future__ import annotations

import inspect
import json
import math
import re
from typing import Any

import grpc
import httpx
import pytest

from env_server.service.gateway import GatewayService
from env_server.service.protocol import SessionService
from env_server.service.service import EnvService
from env_server.testing.launcher import launch_server
from visenv import wire
from visenv.v1 import visenv_pb2 as pb
from visenv.v1 import visenv_pb2_grpc as pb_grpc

MAX_ITEMS = 4  # max_batch_items of the server (the gateway holds calls to its upstream's)
SESSION_ID = re.compile(r"s-[0-9a-f]{16}\.[A-Za-z0-9.-]*[A-Za-z0-9]")


@pytest.mark.parametrize("implementation", [EnvService, GatewayService])
def test_both_services_implement_the_protocol(implementation):
    """Every call of `SessionService` is there, with its parameters, a coroutine where the
    protocol's is; and so are its attributes, on an instance."""
    for name, wanted in vars(SessionService).items():
        if name.startswith("_") or not inspect.isfunction(wanted):
            continue
        got = getattr(implementation, name)
        assert inspect.iscoroutinefunction(got) == inspect.iscoroutinefunction(wanted), name
        assert list(inspect.signature(got).parameters) == list(
            inspect.signature(wanted).parameters
        ), name
    service = EnvService() if implementation is EnvService else GatewayService(["127.0.0.1:1"])
    assert isinstance(service, SessionService)  # runtime_checkable: every member is there
    assert isinstance(service.env_specs, dict)


@pytest.fixture(scope="module")
def servers():
    limit = {"VISENV_MAX_BATCH_ITEMS": str(MAX_ITEMS)}
    server = launch_server(workers=1, envs="tiny,sokoban", extra_env=limit)
    try:
        gateway = launch_server(envs=None, upstreams=[server.grpc])
        try:
            yield {"server": server, "gateway": gateway}
        finally:
            gateway.stop()
    finally:
        server.stop()


def _scrub(value: Any) -> Any:
    """`value` with every session id replaced by "<id>" (and timing info dropped)."""
    if isinstance(value, str):
        return SESSION_ID.sub("<id>", value)
    if isinstance(value, dict):
        return {k: _scrub(v) for k, v in value.items() if k not in ("error_id", "timing")}
    if isinstance(value, list | tuple):
        return type(value)(_scrub(v) for v in value)
    return value


class Rest:
    """The calls over REST, answered as (HTTP status, JSON body) with ids scrubbed."""

    def __init__(self, url: str) -> None:
        self.http = httpx.Client(base_url=url, timeout=60)

    def post(self, path: str, body: Any) -> tuple[int, Any]:
        content = body if isinstance(body, bytes) else json.dumps(body).encode()
        answer = self.http.post(path, content=content, headers={"content-type": "application/json"})
        return answer.status_code, _scrub(answer.json())

    def new(self, env: str = "tiny", seed: int = 1) -> str:
        answer = self.http.post("/v1/sessions", json={"env": env, "seed": seed})
        assert answer.status_code == 200, answer.text
        return answer.json()["session_id"]

    def create(self, items):
        return self.post("/v1/batch/create", {"items": items})

    def reset(self, items):
        return self.post("/v1/batch/reset", {"items": items})

    def step(self, items):
        return self.post("/v1/batch/step", items if isinstance(items, bytes) else {"items": items})

    def get(self, ids):
        return [_scrub((a.status_code, a.json())) for a in map(self._get, ids)]

    def _get(self, sid: str) -> httpx.Response:
        return self.http.get(f"/v1/sessions/{sid}")

    def close(self, ids):
        return self.post("/v1/batch/close", {"session_ids": ids})

    def fork(self, items):
        return self.post("/v1/batch/fork", {"items": items})

    def frame(self, sid):
        answer = self.http.get(f"/v1/sessions/{sid}/frame.png")
        return answer.status_code, answer.headers["content-type"], answer.content


class Grpc:
    """The calls over gRPC, answered as REST's JSON shapes (via `visenv.wire`), or a whole
    call refused as ("refused", visenv code, message)."""

    def __init__(self, address: str) -> None:
        self.channel = grpc.insecure_channel(address)
        self.stub = pb_grpc.VisenvStub(self.channel)

    def call(self, method: str, request: Any, decode) -> Any:
        try:
            response = getattr(self.stub, method)(request, timeout=60)
        except grpc.RpcError as exc:
            code = wire.rpc_error_code(exc)
            return _scrub(("refused", exc.code().name, code, exc.details()))
        return _scrub(decode(response))

    def new(self, env: str = "tiny", seed: int = 1) -> str:
        made = self.stub.Create(pb.CreateRequest(items=[pb.SessionOptions(env=env, seed=seed)]))
        return made.results[0].reply.session_id

    @staticmethod
    def _batch(response) -> list:
        return [wire.batch_item_json(r) for r in wire.batch_from_proto(response)]

    def create(self, items):
        options = [wire.SessionOptions(**i).to_proto() for i in items]
        return self.call("Create", pb.CreateRequest(items=options), self._batch)

    def reset(self, items):
        request = pb.ResetRequest(items=[pb.ResetItem(**i) for i in items])
        return self.call("Reset", request, self._batch)

    def step(self, items):
        return self.call("Step", wire.step_request(items), self._batch)

    def get(self, ids):
        return self.call("Get", pb.GetRequest(session_ids=ids), self._batch)

    def close(self, ids):
        def decode(response):
            return [
                {"ok": True} if e is None else wire.batch_item_json(e)
                for e in wire.close_from_proto(response)
            ]

        return self.call("Close", pb.CloseRequest(session_ids=ids), decode)

    def fork(self, items):
        def decode(response):
            return [
                [r.to_json() for r in a] if isinstance(a, list) else a.to_json()
                for a in wire.fork_from_proto(response)
            ]

        return self.call("Fork", pb.ForkRequest(items=[pb.ForkItem(**i) for i in items]), decode)

    def frame(self, sid):
        def decode(response):
            return [
                f if isinstance(f, bytes) else f.to_json() for f in wire.frames_from_proto(response)
            ]

        return self.call("Frame", pb.FrameRequest(session_ids=[sid]), decode)


def _rest_step(sid: str, index: int, **body) -> dict:
    return {"session_id": sid, "step_index": index, **body}


def _grpc_step(sid: str, index: int, response=None, actions=None) -> wire.StepItem:
    if actions is not None:
        actions = tuple(wire.ActionSpec(a["name"], tuple(a.get("args", ()))) for a in actions)
    return wire.StepItem(sid, index, response, actions)


# Each case drives one client (`c`, Rest or Grpc) and returns what it answered.
def unknown_env(c, step):
    return c.create([{"env": "nosuchenv"}])


def bad_seeds(c, step):
    """docs/wire.md: a bad seed is refused naming `seed` (not `items.0.seed`)."""
    sid = c.new()
    if isinstance(c, Rest):
        seeds = (-1, "x", True, 1.5, 2**63)
        answers = [
            *(c.create([{"env": "tiny", "seed": s}])[1]["results"][0] for s in seeds),
            *(c.reset([{"session_id": sid, "seed": s}])[1]["results"][0] for s in seeds),
            c.post("/v1/sessions", {"env": "tiny", "seed": -1})[1],
            c.post(f"/v1/sessions/{sid}/reset", {"seed": 2**63})[1],
        ]
    else:
        answers = [
            *c.create([{"env": "tiny", "seed": -1}]),
            *c.reset([{"session_id": sid, "seed": -1}]),
        ]
    assert all(a["error"]["field"] == "seed" for a in answers), answers
    return answers


def unknown_session(c, step):
    sid = "s-0123456789abcdef.nosuchnode.0123456789"
    return [
        c.reset([{"session_id": sid}]),
        c.step([step(sid, 0, response="<answer>Left</answer>")]),
        c.get([sid]),
        c.close([sid]),
        c.fork([{"session_id": sid, "n": 1}]),
    ]


def invalid_action(c, step):
    sid = c.new()
    return [
        c.step([step(sid, 0, actions=[{"name": "Jump"}])]),
        c.step([step(sid, 1, response="no answer tag at all")]),
    ]


def nan_argument(c, step):
    sid = c.new()
    if isinstance(c, Rest):
        item = f'{{"session_id": "{sid}", "step_index": 0, "actions": [{{"name": "Left", '
        return c.step(('{"items": [' + item + '"args": [1, NaN]}]}]}').encode())
    return c.step([step(sid, 0, actions=[{"name": "Left", "args": [1.0, math.nan]}])])


def wrong_step_index_and_resent_body(c, step):
    sid = c.new()
    return [
        c.step([step(sid, 5, response="<answer>Left</answer>")]),
        c.step([step(sid, 0, response="<answer>Left</answer>")]),
        c.step([step(sid, 0, response="<answer>Left</answer>")]),  # a retry: from memory
        c.step([step(sid, 0, response="<answer>Right</answer>")]),  # same index, other body
    ]


def over_max_batch_items(c, step):
    sid = c.new()
    return [
        c.create([{"env": "tiny"}] * (MAX_ITEMS + 1)),
        c.step([step(sid, 0, response="<answer>Left</answer>")] * (MAX_ITEMS + 1)),
        c.close([sid] * (MAX_ITEMS + 1)),
        c.get([sid] * (MAX_ITEMS + 1)),  # REST: one GET each (no batch get), gRPC: refused
        c.fork([{"session_id": sid, "n": 1}] * (MAX_ITEMS + 1)),
    ]


def empty_batches(c, step):
    return [c.create([]), c.reset([]), c.step([]), c.close([]), c.fork([])]


def reset_and_frame(c, step):
    sid = c.new(env="sokoban")
    frame = c.frame(sid)
    png = frame[2] if isinstance(c, Rest) else frame[0]
    assert png[:4] == b"\x89PNG", frame
    return [c.reset([{"session_id": sid}]), c.reset([{"session_id": sid, "seed": 7}]), frame]


def empty_actions(c, step):
    sid = c.new()
    return c.step([step(sid, 0, actions=[])])


def same_session_twice(c, step):
    sid = c.new()
    return c.step([step(sid, 0, response="<answer>Left</answer>")] * 2)


def close_twice(c, step):
    sid = c.new()
    return [c.close([sid]), c.close([sid]), c.get([sid])]


def fork(c, step):
    sid = c.new()
    c.step([step(sid, 0, response="<answer>Right</answer>")])
    forked = c.fork([{"session_id": sid, "n": 2}, {"session_id": sid, "n": 1}])
    too_many = c.fork([{"session_id": sid, "n": 10_000}])
    return [forked, too_many]


CASES = [
    unknown_env,
    bad_seeds,
    unknown_session,
    invalid_action,
    nan_argument,
    wrong_step_index_and_resent_body,
    over_max_batch_items,
    empty_batches,
    reset_and_frame,
    empty_actions,
    same_session_twice,
    close_twice,
    fork,
]


@pytest.mark.parametrize("transport", ["rest", "grpc"])
@pytest.mark.parametrize("case", CASES, ids=lambda c: c.__name__)
def test_server_and_gateway_answer_the_same(servers, transport, case):
    answers = {}
    for name, where in servers.items():
        if transport == "rest":
            client, step = Rest(where.url), _rest_step
        else:
            client, step = Grpc(where.grpc), _grpc_step
        answers[name] = case(client, step)
    assert answers["gateway"] == answers["server"]


def test_envs_and_limits_are_the_same(servers):
    """The gateway publishes (and holds calls to) its upstream's limits, and lists the
    environments it serves as the server does (the server also lists those it doesn't)."""
    limits = {n: httpx.get(s.url + "/v1/limits").json() for n, s in servers.items()}
    assert limits["server"]["max_batch_items"] == MAX_ITEMS
    assert limits["gateway"] == limits["server"]
    listed = {}
    for name, where in servers.items():
        body = httpx.get(where.url + "/v1/envs").json()
        with grpc.insecure_channel(where.grpc) as channel:
            answer = pb_grpc.VisenvStub(channel).ListEnvs(pb.ListEnvsRequest(), timeout=60)
        assert json.loads(answer.limits_json) == body["limits"] == limits["server"]
        served = [e for e in body["envs"] if e["enabled"]]
        listed[name] = (served, sorted(e.name for e in answer.envs if e.enabled))
    assert [e["name"] for e in listed["server"][0]] == ["sokoban", "tiny"]
    assert listed["gateway"] == listed["server"]


def test_one_env_check_at_every_door(servers):
    """The native API and the peers' adapters refuse an unknown environment with the same
    error (the service layer's `check_env`), on the server and through the gateway."""
    errors = []
    for where in servers.values():
        with httpx.Client(base_url=where.url, timeout=60) as http:
            made = http.post("/v1/batch/create", json={"items": [{"env": "nosuchenv"}]})
            errors.append(made.json()["results"][0]["error"])
            openenv = http.get("/compat/openenv/nosuchenv/metadata")
            assert openenv.status_code == 404
            errors.append(openenv.json()["error"])
            assert http.get("/compat/vagen/nosuchenv/health").status_code == 404
    assert errors[0]["code"] == "NOT_FOUND" and errors[0]["field"] == "env"
    assert "enabled: ['sokoban', 'tiny']" in errors[0]["message"]
    assert all(e == errors[0] for e in errors), errors
