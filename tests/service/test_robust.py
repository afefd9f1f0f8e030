"""A training-sized request, or a strange value, never takes the server down (issue 22).

Property-based (hypothesis) over REST and gRPC against a real `visenv serve`: non-finite
and huge numbers, unicode, wrong types, duplicate ids in one batch, re-sent steps with
other bodies, batches from 1 to the maximum. Each asserts: no 5xx or INTERNAL, no session
lost or changed by a refused request, every error names its field. Examples are bounded
(a few dozen each) so that the module runs in a minute or two.
"""

from __future__ import annotations

import json
import math
import time

import grpc
import httpx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from visenv.v1 import visenv_pb2 as pb
from visenv.v1 import visenv_pb2_grpc as pb_grpc

MAX_ITEMS = 24  # the server's max_batch_items here
PIECE = 4  # ... and its items per worker message, so that batches go in several pieces
EXAMPLES = settings(
    max_examples=25,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
FAULTY = {"Crash", "Exit", "Hang"}  # tiny's actions that fail on purpose (test_faults.py)


@pytest.fixture(scope="module")
def server():
    from env_server.testing.launcher import launch_server

    srv = launch_server(
        extra_env={
            "VISENV_MAX_BATCH_ITEMS": str(MAX_ITEMS),
            "VISENV_COALESCE_MAX_ITEMS": str(PIECE),
        }
    )
    yield srv
    srv.stop()


@pytest.fixture(scope="module")
def http(server):
    with httpx.Client(base_url=server.url, timeout=60) as client:
        yield client


@pytest.fixture(scope="module")
def witness(http):
    """A session no request of these tests touches: it must stay exactly as it was."""
    sid = http.post("/v1/sessions", json={"env": "sokoban", "seed": 5}).json()["session_id"]
    before = http.get(f"/v1/sessions/{sid}").json()
    yield sid, before
    assert http.get(f"/v1/sessions/{sid}").json() == before


def post(http: httpx.Client, path: str, body) -> httpx.Response:
    """POST `body` as JSON, NaN and Infinity written as the literals a buggy client sends."""
    return http.post(path, content=json.dumps(body), headers={"content-type": "application/json"})


def check_error(reply: httpx.Response) -> dict:
    """A refused request: a 4xx with a structured error that names its field."""
    assert reply.status_code < 500, reply.text
    error = reply.json()["error"]
    assert error["code"] != "INTERNAL", error
    assert error["field"], error
    return error


def nonfinite(values) -> bool:
    return any(isinstance(v, float) and not math.isfinite(v) for v in values)


def fresh_tiny(http: httpx.Client) -> dict:
    reply = http.post("/v1/sessions", json={"env": "tiny", "config": {"length": 32}})
    assert reply.status_code == 200, reply.text
    return reply.json()


numbers = st.one_of(
    st.floats(allow_nan=True, allow_infinity=True),
    st.integers(min_value=-(10**30), max_value=10**30),
    st.just(10**400),
)
wrong = st.one_of(
    st.text(max_size=5), st.booleans(), st.none(), st.lists(st.integers(), max_size=2)
)
names = st.one_of(st.sampled_from(["Left", "Right"]), st.text(max_size=12)).filter(
    lambda n: n not in FAULTY
)


# ---------------------------------------------------------------- steps: numbers, types, unicode
@EXAMPLES
@given(args=st.lists(st.one_of(numbers, wrong), max_size=4), name=names)
def test_rest_step_args_never_5xx_and_refusals_change_nothing(http, witness, args, name):
    session = fresh_tiny(http)
    sid = session["session_id"]
    reply = post(http, f"/v1/sessions/{sid}/step", {
        "step_index": 0, "actions": [{"name": name, "args": args}]})  # fmt: skip
    if reply.status_code == 200:
        assert not nonfinite(args)
        assert reply.json()["step_index"] == 1
    else:
        error = check_error(reply)
        assert error["code"] == "INVALID_ARGUMENT" and error["field"].startswith("actions.0")
        assert http.get(f"/v1/sessions/{sid}").json() == session  # nothing applied
    if nonfinite(args):
        assert reply.status_code == 422, reply.text
    http.delete(f"/v1/sessions/{sid}")


@EXAMPLES
@given(
    args=st.lists(st.floats(allow_nan=True, allow_infinity=True), max_size=4),
    name=names,
)
def test_grpc_step_doubles_never_internal(http, stub, witness, args, name):
    session = fresh_tiny(http)
    sid = session["session_id"]
    item = pb.StepItem(session_id=sid, step_index=0)
    item.actions.actions.add(name=name, args=args)
    (result,) = stub.Step(pb.StepRequest(items=[item])).results
    if nonfinite(args):
        assert result.WhichOneof("result") == "error"
        assert result.error.code == "INVALID_ARGUMENT"
        assert result.error.field.startswith("actions.0.args.")
    if result.WhichOneof("result") == "reply":
        assert result.reply.step_index == 1
    else:
        assert result.error.code not in ("INTERNAL", "SESSION_LOST") and result.error.field
        assert http.get(f"/v1/sessions/{sid}").json() == session
    http.delete(f"/v1/sessions/{sid}")


# ---------------------------------------------------------------- creates: seeds, configs, envs
seeds = st.one_of(
    st.integers(min_value=-(2**70), max_value=2**70),
    st.booleans(),
    st.text(max_size=4),
    st.floats(allow_nan=True, allow_infinity=True),
    st.none(),
)
configs = st.dictionaries(
    st.sampled_from(["length", "max_turns", "size", "p", "ß", "🙂"]),
    st.one_of(numbers, wrong),
    max_size=2,
)


@EXAMPLES
@given(
    env=st.one_of(st.sampled_from(["tiny", "frozenlake", "sokoban"]), st.text(max_size=8)),
    seed=seeds,
    config=configs,
)
def test_rest_create_options_never_5xx(http, witness, env, seed, config):
    before = http.get("/health").json()["sessions"]
    reply = post(http, "/v1/sessions", {"env": env, "seed": seed, "config": config})
    if reply.status_code == 200:
        assert isinstance(seed, int) and not isinstance(seed, bool) and 0 <= seed < 2**63
        http.delete(f"/v1/sessions/{reply.json()['session_id']}")
    else:
        error = check_error(reply)
        if (
            env in ("tiny", "frozenlake", "sokoban")
            and not config
            and not (isinstance(seed, int) and not isinstance(seed, bool) and 0 <= seed < 2**63)
        ):
            assert error["field"] == "seed", error
        assert http.get("/health").json()["sessions"] == before


@EXAMPLES
@given(seed=st.integers(min_value=-(2**63), max_value=2**63 - 1), env=st.sampled_from(
    ["tiny", "frozenlake", "sokoban"]))  # fmt: skip
def test_grpc_seeds_follow_the_one_rule(stub, witness, seed, env):
    (result,) = stub.Create(pb.CreateRequest(items=[pb.SessionOptions(env=env, seed=seed)])).results
    if seed >= 0:
        assert result.WhichOneof("result") == "reply", result.error
        stub.Close(pb.CloseRequest(session_ids=[result.reply.session_id]))
    else:
        assert result.error.code == "INVALID_ARGUMENT" and result.error.field == "seed"


# ---------------------------------------------------------------- retries with other bodies
bodies = st.one_of(
    st.builds(lambda t: {"response": t}, st.text(max_size=30)),
    st.builds(lambda n: {"actions": [{"name": n}]}, st.sampled_from(["Left", "Right"])),
)


@EXAMPLES
@given(first=bodies, again=bodies)
def test_resent_step_index_same_body_stored_reply_other_body_refused(http, witness, first, again):
    sid = fresh_tiny(http)["session_id"]
    applied = post(http, f"/v1/sessions/{sid}/step", {"step_index": 0, **first})
    assert applied.status_code == 200, applied.text
    resent = post(http, f"/v1/sessions/{sid}/step", {"step_index": 0, **again})
    if again == first:
        assert resent.status_code == 200 and resent.json() == applied.json()
    else:
        error = check_error(resent)
        assert resent.status_code == 422 and error["field"] == "step_index"
        assert "different body" in error["message"]
    assert http.get(f"/v1/sessions/{sid}").json() == applied.json()  # the state is unharmed
    http.delete(f"/v1/sessions/{sid}")


# ---------------------------------------------------------------- batches: sizes, duplicate ids
@settings(max_examples=12, deadline=None, suppress_health_check=list(HealthCheck))
@given(n=st.integers(min_value=1, max_value=MAX_ITEMS + 2), dup=st.booleans(), grpc_=st.booleans())
def test_batches_one_to_the_maximum(http, stub, witness, n, dup, grpc_):
    items = [{"env": "tiny", "seed": s} for s in range(n)]
    if grpc_:
        request = pb.CreateRequest(items=[pb.SessionOptions(env="tiny", seed=s) for s in range(n)])
        if n > MAX_ITEMS:
            with pytest.raises(grpc.RpcError) as refused:
                stub.Create(request)
            assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT
            assert f"limit of {MAX_ITEMS} items" in refused.value.details()
            return
        results = stub.Create(request).results
        assert all(r.WhichOneof("result") == "reply" for r in results)
        ids = [r.reply.session_id for r in results]
    else:
        reply = http.post("/v1/batch/create", json={"items": items})
        if n > MAX_ITEMS:
            error = check_error(reply)
            assert error["field"] == "items" and f"limit of {MAX_ITEMS} items" in error["message"]
            return
        assert reply.status_code == 200 and all(r["ok"] for r in reply.json()["results"])
        ids = [r["reply"]["session_id"] for r in reply.json()["results"]]
    steps = [{"session_id": sid, "step_index": 0, "actions": [{"name": "Right"}]} for sid in ids]
    if dup:
        steps[-1] = dict(steps[0])  # the first session twice in one batch
    results = http.post("/v1/batch/step", json={"items": steps}).json()["results"]
    if dup and n > 1:
        assert results[0]["ok"] and not results[-1]["ok"]
        assert results[-1]["error"]["field"] == "session_id"
        assert "twice" in results[-1]["error"]["message"]
        results = results[:-1]
    assert all(r["ok"] and r["reply"]["step_index"] == 1 for r in results)
    closed = http.post("/v1/batch/close", json={"session_ids": ids}).json()["results"]
    assert all(r["ok"] for r in closed)


# ---------------------------------------------------------------- explicit cases
def test_limits_are_published_the_same_everywhere(http, stub):
    limits = http.get("/v1/limits").json()
    assert limits["max_batch_items"] == MAX_ITEMS
    assert limits["items_per_worker_message"] == PIECE
    assert limits["seed"] == {"type": "integer", "minimum": 0, "maximum": 2**63 - 1}
    assert http.get("/v1/envs").json()["limits"] == limits
    assert http.get("/health").json()["limits"] == limits
    assert json.loads(stub.ListEnvs(pb.ListEnvsRequest()).limits_json) == limits


def test_over_limit_actions_one_error_and_empty_list_refused(http):
    sid = fresh_tiny(http)["session_id"]
    many = http.post(f"/v1/sessions/{sid}/step", json={
        "step_index": 0, "actions": [{"name": "Right"}] * 10_000})  # fmt: skip
    error = check_error(many)
    assert error["field"] == "actions" and "limit of 16" in error["message"]
    assert len(many.content) < 1000  # one error, not one per action
    empty = http.post(f"/v1/sessions/{sid}/step", json={"step_index": 0, "actions": []})
    assert check_error(empty)["field"] == "actions"
    within = http.post(f"/v1/sessions/{sid}/step", json={
        "step_index": 0, "actions": [{"name": "Right"}] * 5})  # fmt: skip
    assert within.status_code == 200  # tiny takes 2 a turn: the rest are reported
    assert len(within.json()["info"]["invalid_actions"]) == 3
    http.delete(f"/v1/sessions/{sid}")


def test_over_limit_grpc_message_refused(server):
    big = "x" * (9 * 1024 * 1024)  # over max_request_bytes (8 MiB), as REST's 413
    with grpc.insecure_channel(
        server.grpc, options=[("grpc.max_send_message_length", 64 << 20)]
    ) as channel:
        stub = pb_grpc.VisenvStub(channel)
        item = pb.StepItem(session_id="s-0000000000000000", step_index=0, response=big)
        with pytest.raises(grpc.RpcError) as refused:
            stub.Step(pb.StepRequest(items=[item]))
        assert refused.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED


def test_unwritable_reply_is_internal_and_the_session_stays_readable(http):
    made = http.post("/v1/sessions", json={"env": "tiny", "seed": 668})  # NaN once moved
    sid = made.json()["session_id"]
    step = {"step_index": 0, "actions": [{"name": "Right"}]}
    reply = http.post(f"/v1/sessions/{sid}/step", json=step)
    assert reply.status_code == 500
    error = reply.json()["error"]
    assert error["code"] == "INTERNAL" and error["error_id"].startswith("err-")
    kept = http.get(f"/v1/sessions/{sid}")
    assert kept.status_code == 200, kept.text
    body = kept.json()
    assert body["step_index"] == 1 and body["observation"]["ground_truth"]["distance"] is None
    assert body["info"]["unwritable"]["error_id"] == error["error_id"]
    assert http.post(f"/v1/sessions/{sid}/step", json=step).json() == body  # a retry
    assert http.delete(f"/v1/sessions/{sid}").status_code == 200


def test_seed_errors_name_the_field(http):
    for seed in (-1, 2**63, True, "5", 1.5):
        error = check_error(http.post("/v1/sessions", json={"env": "tiny", "seed": seed}))
        assert error["field"] == "seed", (seed, error)
    sid = fresh_tiny(http)["session_id"]
    for seed in (-1, True, "5"):
        error = check_error(http.post(f"/v1/sessions/{sid}/reset", json={"seed": seed}))
        assert error["field"] == "seed", (seed, error)
    assert http.post(f"/v1/sessions/{sid}/reset", json={"seed": 2**63 - 1}).status_code == 200
    http.delete(f"/v1/sessions/{sid}")


@pytest.mark.parametrize(
    "options, field",
    [
        ({"config": {"step_reward": 1e308}}, "config.step_reward"),
        ({"config": {"solved_reward": -1e7}}, "config.solved_reward"),
        ({"reasoning": {"format_reward": 1e308}}, "reasoning.format_reward"),
        ({"reasoning": {"beta_s": 1e300, "beta_w": 1e300}}, "reasoning.beta_s"),
    ],
)
def test_reward_options_that_could_overflow_are_refused_at_create(http, options, field):
    """Each reward option is finite and within +-REWARD_LIMIT (1e6): one that a turn's sum
    would overflow is refused when the session is made, naming it, never a 500 at a step."""
    before = http.get("/health").json()["sessions"]
    error = check_error(
        post(http, "/v1/sessions", {"env": "sokoban", "format": "no_think", **options})
    )
    assert error["code"] == "INVALID_ARGUMENT" and error["field"] == field, error
    assert http.get("/health").json()["sessions"] == before
    # the largest allowed values step without an error
    big = {k: {n: 1e6 for n in v} for k, v in options.items()}
    made = post(http, "/v1/sessions", {"env": "sokoban", "format": "no_think", **big})
    assert made.status_code == 200, made.text
    sid = made.json()["session_id"]
    step = http.post(
        f"/v1/sessions/{sid}/step",
        json={"step_index": 0, "response": "<answer>Left, Right</answer>"},
    )
    assert step.status_code == 200, step.text
    http.delete(f"/v1/sessions/{sid}")


def test_a_long_invalid_action_is_named_not_echoed_whole(http):
    """A refusal names what it refuses by its start and length: 16 actions of 100 KB make
    a reply of a few KB, not 1.6 MB (and the session keeps no more than that)."""
    sid = http.post("/v1/sessions", json={"env": "sokoban", "seed": 1}).json()["session_id"]
    names = [c * 100_000 for c in "abcdefghijklmnop"]
    step = {"step_index": 0, "actions": [{"name": n} for n in names]}
    reply = http.post(f"/v1/sessions/{sid}/step", json=step)
    assert reply.status_code == 200, reply.text[:300]
    refused = reply.json()["info"]["invalid_actions"]
    assert len(refused) == 16 and all("(100000 characters)" in r for r in refused), refused[:2]
    assert refused[0].startswith("a" * 80 + "...") and "unknown action" in refused[0]
    assert len(reply.content) < 20_000
    assert len(http.get(f"/v1/sessions/{sid}").content) < 20_000
    http.delete(f"/v1/sessions/{sid}")


def test_a_payload_is_refused_where_actions_are_not_documents(http):
    """Only a document action (svg's, vicrit's) reads a payload; elsewhere it would be
    dropped unread, so it is refused naming it, and the step is not applied."""
    sid = http.post("/v1/sessions", json={"env": "sokoban", "seed": 1}).json()["session_id"]
    step = {"step_index": 0, "actions": [{"name": "Left"}, {"name": "Up", "payload": "x" * 1000}]}
    error = check_error(http.post(f"/v1/sessions/{sid}/step", json=step))
    assert error["code"] == "INVALID_ARGUMENT" and error["field"] == "actions.1.payload", error
    assert "no payload" in error["message"]
    assert http.get(f"/v1/sessions/{sid}").json()["step_index"] == 0  # nothing applied
    http.delete(f"/v1/sessions/{sid}")


def test_reset_without_a_seed_after_the_last_seed_starts_again_at_0(http):
    """An unset seed is the previous one + 1; past 2**63 - 1 that is 0, never a refusal
    naming a seed the client did not send."""
    top = http.post("/v1/sessions", json={"env": "sokoban", "seed": 2**63 - 1}).json()
    sid = top["session_id"]
    again = http.post(f"/v1/sessions/{sid}/reset", json={})
    assert again.status_code == 200, again.text
    first = http.post("/v1/sessions", json={"env": "sokoban", "seed": 0}).json()
    for key in ("text", "ground_truth"):
        assert again.json()["observation"][key] == first["observation"][key]
    for s in (sid, first["session_id"]):
        http.delete(f"/v1/sessions/{s}")


def test_big_batch_in_pieces_while_other_sessions_are_served(start_visenv_server):
    """A batch whose whole time is several times the deadline goes through in pieces;
    the deadline never takes the busy worker for stuck, and another session's calls are
    answered between the pieces."""
    server = start_visenv_server(
        envs="tiny",
        max_sessions=1000,
        extra_env={
            "VISENV_DEADLINES": json.dumps({"tiny": 1.0}),
            "VISENV_COALESCE_MAX_ITEMS": "4",
        },  # fmt: skip
    )
    import threading

    with server.client() as c:
        probe = c.post("/v1/sessions", json={"env": "tiny"}).json()["session_id"]
        latencies: list[float] = []
        done = threading.Event()

        def poke() -> None:
            with server.client() as p:
                while not done.is_set():
                    started = time.monotonic()
                    assert p.get(f"/v1/sessions/{probe}").status_code == 200
                    reset = p.post(f"/v1/sessions/{probe}/reset", json={})
                    assert reset.status_code == 200, reset.text  # reaches its worker
                    latencies.append(time.monotonic() - started)
                    time.sleep(0.05)

        thread = threading.Thread(target=poke)
        thread.start()
        started = time.monotonic()
        # 2 workers x 40 resets x 0.05 s: 2 s a worker, twice the deadline; 0.2 s a piece
        items = [{"env": "tiny", "seed": s, "config": {"reset_delay": 0.05}} for s in range(80)]
        results = c.post("/v1/batch/create", json={"items": items}, timeout=300).json()["results"]
        took = time.monotonic() - started
        done.set()
        thread.join()
        assert all(r["ok"] for r in results), [r for r in results if not r["ok"]][:2]
        health = c.get("/health").json()
        assert health["worker_restarts"] == 0 and took > 1.5  # longer than the deadline
        assert len(latencies) >= 3 and max(latencies) < took
        ids = [r["reply"]["session_id"] for r in results]
        assert all(r["ok"] for r in c.post("/v1/batch/close", json={"session_ids": ids}).json()[
            "results"])  # fmt: skip


def test_health_reports_each_environments_readiness(http, server):
    from grpc_health.v1 import health_pb2, health_pb2_grpc

    health = http.get("/health").json()
    assert health["status"] == "ok"
    assert health["ready"] == {"frozenlake": True, "sokoban": True, "tiny": True}
    with grpc.insecure_channel(server.grpc) as channel:
        check = health_pb2_grpc.HealthStub(channel).Check
        deadline = time.monotonic() + 10  # app.serve copies readiness every 0.5 s
        while True:
            try:
                status = check(health_pb2.HealthCheckRequest(service="visenv.env.tiny")).status
            except grpc.RpcError:  # not set yet: NOT_FOUND
                status = None
            if status == health_pb2.HealthCheckResponse.SERVING or time.monotonic() > deadline:
                break
            time.sleep(0.2)
        assert status == health_pb2.HealthCheckResponse.SERVING


def test_narrow_seeds_are_derived_deterministically():
    from env_server.core.env import SEED_LIMIT, narrow_seed

    assert narrow_seed(5, 32) == 5 and narrow_seed(2**32 - 1, 32) == 2**32 - 1
    derived = [narrow_seed(s, 32) for s in (2**32, 2**40, SEED_LIMIT - 1)]
    assert all(0 <= d < 2**32 for d in derived) and len(set(derived)) == 3
    assert derived == [narrow_seed(s, 32) for s in (2**32, 2**40, SEED_LIMIT - 1)]
