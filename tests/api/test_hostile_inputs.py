"""Hostile and careless input (issue 42), over every transport that takes it, against a real
`visenv serve`: each is answered with a structured error naming what was wrong; a session
it was aimed at stays readable and steppable, unchanged; and no session slot is left held
(`/health`'s count is back to what the test holds). bench/hostile_inputs.py replays the
same probes and prints what they cost others."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator

import grpc
import httpx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from websockets.sync.client import connect as ws_connect

from env_server.testing.launcher import VisenvServer, launch_server
from visenv.v1 import visenv_pb2 as pb
from visenv.v1 import visenv_pb2_grpc as pb_grpc

JSON = {"content-type": "application/json"}
LEFT = {"name": "Left"}


def deep(n: int) -> str:
    """A JSON object nested n deep."""
    return '{"a":' * n + "1" + "}" * n


@pytest.fixture(scope="module")
def server() -> Iterator[VisenvServer]:
    served = launch_server(workers=1, envs="sokoban", max_sessions=8)
    yield served
    served.stop()


@pytest.fixture(scope="module")
def http(server) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=server.url, timeout=60) as client:
        yield client


@pytest.fixture(scope="module")
def stub(server) -> Iterator[pb_grpc.VisenvStub]:
    with grpc.insecure_channel(server.grpc) as channel:
        yield pb_grpc.VisenvStub(channel)


def post(http: httpx.Client, path: str, text: str) -> httpx.Response:
    """POST `text` as it stands (a lone surrogate escape is sent as written)."""
    return http.post(path, content=text.encode("utf-8", "surrogatepass"), headers=JSON)


def held(http: httpx.Client) -> int:
    return http.get("/health").json()["sessions"]


def refused(r: httpx.Response, status: int, field: str | None) -> None:
    assert r.status_code == status, r.text
    error = r.json()["error"]
    assert error["code"] == "INVALID_ARGUMENT", error
    if field is not None:
        assert error["field"] == field, error


@pytest.fixture
def session(http) -> Iterator[str]:
    """A sokoban session stepped once; the test checks it is intact afterwards."""
    assert held(http) == 0  # every earlier probe left no slot held
    sid = http.post("/v1/sessions", json={"env": "sokoban", "format": "no_think"}).json()[
        "session_id"
    ]
    r = http.post(f"/v1/sessions/{sid}/step", json={"step_index": 0, "actions": [LEFT]})
    assert r.status_code == 200, r.text
    before = http.get(f"/v1/sessions/{sid}").json()
    yield sid
    after = http.get(f"/v1/sessions/{sid}")
    assert after.status_code == 200, after.text
    assert after.json() == before  # readable, unchanged by the probe
    r = http.post(f"/v1/sessions/{sid}/step", json={"step_index": 1, "actions": [LEFT]})
    assert r.status_code == 200, r.text  # and it goes on
    assert http.delete(f"/v1/sessions/{sid}").status_code == 200
    assert held(http) == 0


# ---- 1. nesting, and the slot of a create that fails ----------------------------------------
@pytest.mark.parametrize("depth", [40, 600, 100_000])
def test_a_deep_config_is_refused_and_holds_no_slot(http, depth):
    refused(post(http, "/v1/sessions", f'{{"env":"sokoban","config":{deep(depth)}}}'), 422, None)
    assert held(http) == 0


def test_a_batch_answers_per_item_and_frees_the_bad_items_slot(http):
    good = '{"env":"sokoban"}'
    r = post(
        http,
        "/v1/batch/create",
        f'{{"items":[{good},{{"env":"sokoban","config":{deep(600)}}},{good}]}}',
    )
    assert r.status_code == 200, r.text
    results = r.json()["results"]
    assert [res.get("error", {}).get("code", "ok") for res in results] == [
        "ok",
        "INVALID_ARGUMENT",
        "ok",
    ]
    assert held(http) == 2  # the good ones, and only they
    ids = [res["reply"]["session_id"] for res in results if res["ok"]]
    http.post("/v1/batch/close", json={"session_ids": ids})
    assert held(http) == 0


@pytest.mark.parametrize("field", ["config_json", "reasoning_json"])
@pytest.mark.parametrize("depth", [600, 100_000])
def test_grpc_deep_json_is_invalid_argument(http, stub, field, depth):
    request = pb.CreateRequest(items=[pb.SessionOptions(env="sokoban", **{field: deep(depth)})])
    try:
        reply = stub.Create(request, timeout=60)
    except grpc.RpcError as exc:  # the whole call refused: as INVALID_ARGUMENT, not INTERNAL
        assert exc.code() == grpc.StatusCode.INVALID_ARGUMENT, exc.details()
    else:
        (result,) = reply.results
        assert result.error.code == "INVALID_ARGUMENT", result
        assert field.removesuffix("_json") in result.error.field + result.error.message
    assert held(http) == 0


def test_vagen_deep_data_part_is_refused(http):
    files = {"data": (None, f'{{"env_config":{{}},"seed":0,"x":{deep(600)}}}', "application/json")}
    r = http.post("/compat/vagen/sokoban/connect", files=files)
    assert r.status_code == 400, r.text
    assert r.json()["error"]["code"] == "INVALID_ARGUMENT"
    assert held(http) == 0


# ---- 3. text that is not valid Unicode ------------------------------------------------------
@pytest.mark.parametrize(
    "body, field",
    [
        ('{"step_index":1,"response":"<answer>\\ud800</answer>"}', "response"),
        ('{"step_index":1,"actions":[{"name":"\\ud800"}]}', "actions.0.name"),
        ('{"step_index":1,"actions":[{"name":"Left","payload":"\\udfff"}]}', "actions.0.payload"),
    ],
)
def test_a_lone_surrogate_in_a_step_leaves_the_session_as_it_was(http, session, body, field):
    refused(post(http, f"/v1/sessions/{session}/step", body), 422, field)


def test_a_lone_surrogate_in_a_config_holds_no_slot(http):
    refused(post(http, "/v1/sessions", '{"env":"sokoban","config":{"x":"\\ud800"}}'), 422, None)
    assert held(http) == 0


def test_grpc_bytes_that_are_not_utf8_are_invalid_argument(server, http, session):
    with grpc.insecure_channel(server.grpc) as channel:
        raw = channel.unary_unary("/visenv.v1.Visenv/Get")  # bytes in, bytes out
        with pytest.raises(grpc.RpcError) as caught:
            raw(b"\x0a\x02\xff\xfe", timeout=30)  # session_ids[0] = b"\xff\xfe"
    assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT, caught.value.details()


# ---- 8. strict types --------------------------------------------------------------------------
@pytest.mark.parametrize("value", ['"1"', "1.0", "true"])
def test_step_index_is_an_integer(http, session, value):
    body = f'{{"step_index":{value},"actions":[{{"name":"Left"}}]}}'
    refused(post(http, f"/v1/sessions/{session}/step", body), 422, "step_index")


def test_an_action_that_takes_no_arguments_refuses_them(http, session):
    r = http.post(
        f"/v1/sessions/{session}/step",
        json={"step_index": 1, "actions": [{"name": "Left", "args": [0]}]},
    )
    refused(r, 422, "actions.0.args")
    r = http.post(
        f"/v1/sessions/{session}/step",
        json={"step_index": 1, "actions": [{"name": "Left", "args": [0] * 100_000}]},
    )
    refused(r, 422, "actions.0.args")


def test_a_405_says_what_is_allowed(http):
    r = http.request("PUT", "/v1/sessions")
    assert r.status_code == 405 and r.headers["allow"] == "POST"


# ---- the WebSocket (OpenEnv) ------------------------------------------------------------------
@pytest.mark.parametrize(
    "message, field",
    [
        (f'{{"type":"reset","data":{{"config":{deep(600)}}}}}', "config"),
        ('{"type":"reset","data":{"seed":true}}', "seed"),
        ('{"type":"reset","data":{"seed":"5"}}', "seed"),
        ('{"type":"step","data":{"actions":["\\ud800"]}}', "actions.0.name"),
        ('{"type":"step","data":{"actions":[{"name":"Left","args":[NaN]}]}}', "actions.0.args.0"),
    ],
)
def test_websocket_answers_an_error_and_stays_open(server, http, message, field):
    url = server.url.replace("http", "ws") + "/compat/openenv/sokoban/ws"
    with ws_connect(url, max_size=None) as ws:
        ws.send(json.dumps({"type": "reset", "data": {"seed": 3}}))
        assert json.loads(ws.recv(timeout=30))["type"] == "observation"
        ws.send(message)
        reply = json.loads(ws.recv(timeout=30))
        assert reply["type"] == "error", reply
        assert reply["data"].get("field") == field, reply
        ws.send(json.dumps({"type": "step", "data": {"actions": ["Left"]}}))  # still served
        assert json.loads(ws.recv(timeout=30))["type"] == "observation"
    assert held(http) == 0  # the connection's session is closed with it


def test_websocket_closed_by_its_client_logs_no_error(server, http):
    """OpenEnv's client says `close` and shuts the socket at once; the server's own close
    then meets a gone client, which is no error (it logged a traceback per connection)."""
    url = server.url.replace("http", "ws") + "/compat/openenv/sokoban/ws"
    seen = len(server.output)
    for _ in range(4):
        with ws_connect(url, max_size=None) as ws:
            ws.send(json.dumps({"type": "reset", "data": {"seed": 3}}))
            assert json.loads(ws.recv(timeout=30))["type"] == "observation"
            ws.send(json.dumps({"type": "close"}))
    deadline = time.monotonic() + 10
    while held(http) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert held(http) == 0
    time.sleep(0.5)  # (a traceback is written after the close)
    logged = "".join(server.output[seen:])
    assert "Traceback" not in logged and "Exception in ASGI" not in logged, logged[-2000:]


# ---- generated: nesting and Unicode -------------------------------------------------------------
TEXT = st.text(st.characters(codec=None, exclude_categories=()), max_size=12)  # surrogates too
VALUES = st.recursive(
    st.none() | st.booleans() | st.integers() | TEXT,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(TEXT, inner, max_size=3),
    max_leaves=60,
)


def nested(value, depth: int):
    for _ in range(depth):
        value = {"k": value}
    return value


def dumps(value) -> bytes:
    return json.dumps(value, ensure_ascii=False).encode("utf-8", "surrogatepass")


@settings(max_examples=40, deadline=None, suppress_health_check=list(HealthCheck))
@given(value=VALUES, depth=st.integers(0, 80))
def test_generated_reasoning_is_taken_or_refused_by_name_and_never_holds_a_slot(http, value, depth):
    body = {"env": "sokoban", "reasoning": {"x": nested(value, depth)}}
    r = http.post("/v1/sessions", content=dumps(body), headers=JSON)
    assert r.status_code in (200, 422), r.text  # never a 5xx
    if r.status_code == 200:
        assert http.delete(f"/v1/sessions/{r.json()['session_id']}").status_code == 200
    else:
        assert r.json()["error"]["code"] == "INVALID_ARGUMENT"
    assert held(http) == 0


@settings(max_examples=40, deadline=None, suppress_health_check=list(HealthCheck))
@given(text=TEXT)
def test_generated_responses_never_break_a_session(http, text):
    sid = http.post("/v1/sessions", json={"env": "sokoban", "format": "no_think"}).json()[
        "session_id"
    ]
    try:
        body = {"step_index": 0, "response": f"<answer>{text}</answer>"}
        r = http.post(f"/v1/sessions/{sid}/step", content=dumps(body), headers=JSON)
        valid = all(not 0xD800 <= ord(c) <= 0xDFFF for c in text)
        if valid:
            assert r.status_code == 200, r.text  # an unparsable answer is a turn, not an error
        else:
            refused(r, 422, "response")
        after = http.get(f"/v1/sessions/{sid}")
        assert after.status_code == 200, after.text
        assert after.json()["step_index"] == (1 if valid else 0)
    finally:
        http.delete(f"/v1/sessions/{sid}")
    assert held(http) == 0


# ---- 9. the bearer scheme, one rule ---------------------------------------------------------------
def test_the_bearer_scheme_is_case_insensitive_on_every_transport():
    served = launch_server(workers=1, envs="sokoban", token="sekret")
    try:
        with httpx.Client(base_url=served.url, timeout=30) as http:
            assert http.get("/v1/limits").status_code == 401
            assert http.get("/v1/limits", headers={"authorization": "bearer sekret"}).is_success
            assert http.get("/", follow_redirects=False).status_code in (302, 307)  # to /play
        with grpc.insecure_channel(served.grpc) as channel:
            stub = pb_grpc.VisenvStub(channel)
            for scheme in ("Bearer", "bearer", "BEARER"):
                stub.ListEnvs(
                    pb.ListEnvsRequest(),
                    metadata=[("authorization", f"{scheme} sekret")],
                    timeout=30,
                )
            with pytest.raises(grpc.RpcError) as caught:
                stub.ListEnvs(
                    pb.ListEnvsRequest(), metadata=[("authorization", "bearer wrong")], timeout=30
                )
            assert caught.value.code() == grpc.StatusCode.UNAUTHENTICATED
        url = served.url.replace("http", "ws") + "/compat/openenv/sokoban/ws"
        with ws_connect(url, additional_headers={"authorization": "bearer sekret"}) as ws:
            ws.send(json.dumps({"type": "reset", "data": {"seed": 1}}))
            assert json.loads(ws.recv(timeout=30))["type"] == "observation"
    finally:
        served.stop()


# ---- a large JSON body is parsed off the event loop, with the same answers ----------------------
def test_a_large_body_is_read_as_a_small_one(http, session):
    pad = "x" * 70_000  # over rest.OFFLOAD_BODY_BYTES: parsed in a thread, by pydantic-core
    body = f'{{"step_index":1,"response":"<answer>Left</answer>{pad}\\ud800"}}'
    refused(post(http, f"/v1/sessions/{session}/step", body), 422, "response")
    r = post(http, f"/v1/sessions/{session}/step", f'{{"step_index":1,"response":"{pad}')
    assert r.status_code == 422 and r.json()["error"]["code"] == "INVALID_ARGUMENT", r.text
    items = ",".join(f'{{"env":"sokoban","seed":{i},"config":{{"max_turns":1e400}}}}'
                     for i in range(3))  # fmt: skip
    r = post(http, "/v1/batch/create", f'{{"items":[{items}]}}{" " * 70_000}')
    assert r.status_code == 200, r.text
    assert [res["error"]["code"] for res in r.json()["results"]] == ["INVALID_ARGUMENT"] * 3
