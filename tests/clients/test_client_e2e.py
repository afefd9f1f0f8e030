"""The client SDK end to end against real `visenv serve` processes on loopback."""

from __future__ import annotations

import asyncio
import collections
import dataclasses
import random
import socket
import subprocess
import sys
import threading

import grpc
import httpx
import numpy as np
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc

from clients import (
    AsyncEnvClient,
    DeadlineExceeded,
    EnvClient,
    InvalidArgument,
    NotFound,
    PolicyInput,
    SessionLost,
    SessionOptions,
    Unauthenticated,
    Unavailable,
)
from tests.clients.conftest import TOKEN  # the first server needs it; the second ignores it
from tests.clients.lossy_proxy import LossyProxy

MOVES = ["Up", "Down", "Left", "Right"]


def random_policy(batch: list[PolicyInput]) -> list[str]:
    """Two seeded random moves per turn (deterministic per episode and turn)."""
    out = []
    for p in batch:
        rng = random.Random(p.seed * 1000 + p.turn)
        out.append(f"<answer>{', '.join(rng.choice(MOVES) for _ in range(2))}</answer>")
    return out


def test_episodes_spread_over_both_servers(two_servers):
    a, b = two_servers
    with EnvClient(token=TOKEN, servers=[a.grpc, b.grpc]) as client:
        trajs = client.run_episodes(
            random_policy, "sokoban", seeds=range(8), format="no_think", max_turns=3, progress=False
        )
        assert client.session_ids == []  # finished episodes' sessions are closed
    assert [t.seed for t in trajs] == list(range(8))
    assert {t.server for t in trajs} == {a.grpc, b.grpc}
    for t in trajs:
        assert t.ok and 1 <= len(t.turns) <= 3
        assert t.turns[0].prompt.startswith(t.system_prompt) and t.system_prompt
        assert all(not turn.prompt.startswith(t.system_prompt) for turn in t.turns[1:])
        assert t.truncated or t.terminated
        for turn in t.turns:
            assert turn.images[0].to_array().shape == (96, 96, 3)
            assert turn.reward == pytest.approx(sum(turn.reward_parts.to_dict().values()))
            assert turn.info["action_valid"] is True
            assert turn.ground_truth["player"]


@pytest.mark.parametrize("transport", ["http", "grpc"])
def test_concurrent_creates_of_one_session_each_spread_over_both_servers(two_servers, transport):
    """Each create asks the servers' session counts, which don't count the creates still in
    flight: eight agent loops creating one session each at once (verl's) all went to the
    first server. Now both fill up, within two of each other: a create still in flight may
    already be counted by its server too, so a split of 5/3 happens (the servers may also
    hold other tests' sessions)."""
    a, b = two_servers
    addresses = [f"http://{s.http}" if transport == "http" else s.grpc for s in (a, b)]

    def held() -> list[int]:
        return [httpx.get(f"http://{s.http}/health", timeout=10).json()["sessions"] for s in (a, b)]

    before = held()
    assert abs(before[0] - before[1]) <= 2, before  # else all eight may rightly go to one

    async def main() -> tuple[list[str], list[int]]:
        async with AsyncEnvClient(addresses, transport=transport, token=TOKEN) as client:
            made = await asyncio.gather(
                *(client.create([SessionOptions("sokoban", seed=i)]) for i in range(8))
            )
            placed = [replies[0].server for replies in made]
            after = held()
            await client.close([replies[0].session_id for replies in made])
            return placed, after

    placed, after = asyncio.run(main())
    counts = collections.Counter(placed)
    assert len(counts) == 2 and sum(after) == sum(before) + 8, (placed, before, after)
    assert abs(after[0] - after[1]) <= 2, (placed, before, after)  # 8/0 before the fix


def test_concurrency_limit_reuses_sessions(two_servers):
    a, b = two_servers
    seen_batches: list[int] = []

    async def policy(batch):
        seen_batches.append(len(batch))
        return random_policy(batch)

    with EnvClient(token=TOKEN, servers=[a.http, b.http], transport="http") as client:
        trajs = client.run_episodes(policy, "frozenlake", seeds=range(5), max_turns=2, concurrency=2,
                                    format="no_think", progress=False)  # fmt: skip
    assert max(seen_batches) == 2
    assert all(t.ok and t.turns for t in trajs)
    assert len({t.session_id for t in trajs}) == 2  # two sessions, reset for later seeds
    msgs = PolicyInput(0, 0, 1, "SYS", trajs[0].final_observation, trajs[0].turns[:1]).messages()
    assert [m["role"] for m in msgs] == ["system", "user", "assistant", "user"]
    assert any(part["type"] == "image" for part in msgs[1]["content"])


def _play(address: str, transport: str) -> list[tuple]:
    """Seed 7, four fixed responses: everything the agent and trainer would see."""
    responses = [
        "<answer>Left, Up</answer>",
        "<answer>Down</answer>",
        "nonsense",
        "<answer>Right, Right</answer>",
    ]
    with EnvClient(token=TOKEN, servers=address, transport=transport) as client:
        (reply,) = client.create(SessionOptions("sokoban", seed=7, format="no_think"))
        record = [(reply.observation.text, reply.observation.images[0].data, reply.observation.ground_truth,
                   reply.system_prompt)]  # fmt: skip
        for text in responses:
            (reply,) = client.step(reply.session_id, text)
            record.append((reply.observation.text, reply.observation.images[0].data, reply.observation.ground_truth,
                           reply.reward, reply.reward_parts, reply.terminated, reply.truncated, reply.success,
                           reply.step_index, reply.info))  # fmt: skip
    return record


def test_same_seed_same_episode_over_rest_and_grpc(two_servers):
    a, b = two_servers
    over_rest = _play(a.http, "http")
    over_grpc = _play(b.grpc, "grpc")
    assert over_rest == over_grpc
    assert over_rest[3][4].format == 0.0 and over_rest[3][9]["action_valid"] is False  # "nonsense"


def test_session_made_over_rest_is_stepped_over_grpc(two_servers):
    a, _ = two_servers
    with (
        EnvClient(a.http, transport="http", token=TOKEN) as rest,
        EnvClient(a.grpc, token=TOKEN) as grpc_client,
    ):
        (made,) = rest.create(SessionOptions("sokoban", seed=3, format="no_think"))
        adopted = grpc_client.attach(made.session_id, a.grpc)
        assert adopted.observation == made.observation
        (stepped,) = grpc_client.step(made.session_id, "<answer>Up</answer>")
        assert stepped.step_index == 1
        (seen,) = rest.get(made.session_id)
        assert seen.observation == stepped.observation and seen.step_index == 1
        # the REST client still sends step_index 0: taken for a retry, answered from
        # memory, not applied again
        (replayed,) = rest.step(made.session_id, "<answer>Up</answer>")
        assert replayed == dataclasses.replace(stepped, server=replayed.server)
        assert grpc_client.get(made.session_id)[0].step_index == 1
        (again,) = grpc_client.step(made.session_id, "<answer>Down</answer>")
        assert again.step_index == 2
        # a step two behind the session is refused, whatever it holds
        stale = httpx.post(f"http://{a.http}/v1/sessions/{made.session_id}/step",
                           json={"step_index": 0, "response": "<answer>Up</answer>"},
                           headers={"authorization": f"Bearer {TOKEN}"})  # fmt: skip
        assert stale.status_code == 409 and stale.json()["error"]["code"] == "FAILED_PRECONDITION"


@pytest.mark.parametrize("transport", ["http", "grpc"])
def test_step_retried_after_lost_reply_is_applied_once(two_servers, transport):
    a, _ = two_servers
    target = a.http if transport == "http" else a.grpc
    proxy = LossyProxy(target)
    try:
        with EnvClient(token=TOKEN, servers=proxy.address, transport=transport, retries=3) as client, \
                EnvClient(token=TOKEN, servers=target, transport=transport) as direct:  # fmt: skip
            (reply,) = client.create(SessionOptions("sokoban", seed=11, format="no_think"))
            sid = reply.session_id
            proxy.lose_next_reply()
            (stepped,) = client.step(sid, "<answer>Left</answer>")
            assert proxy.lost == 1  # the first reply was really lost, the retry answered
            assert stepped.step_index == 1 and stepped.turn == 1
            seen = direct.attach(sid, target)
            assert seen.step_index == 1 and seen.observation == stepped.observation
            (nxt,) = client.step(sid, "<answer>Right</answer>")
            assert nxt.step_index == 2
    finally:
        proxy.close()


@pytest.mark.parametrize("transport", ["http", "grpc"])
def test_lost_create_reply_is_not_retried_and_stalls_time_out(two_servers, transport):
    a, _ = two_servers
    target = a.http if transport == "http" else a.grpc
    proxy = LossyProxy(target)
    try:
        with EnvClient(proxy.address, transport=transport, token=TOKEN, timeout=1.5) as client:
            client.list_envs()  # connected
            proxy.lose_next_reply()
            with pytest.raises(Unavailable):  # it may have been made: never made twice
                client.create(SessionOptions("sokoban", seed=1))
            assert proxy.lost == 1
            (reply,) = client.create(SessionOptions("sokoban", seed=1))
            proxy.stall = True
            with pytest.raises(DeadlineExceeded):
                client.step(reply.session_id, "<answer>Up</answer>")
    finally:
        proxy.close()


@pytest.mark.parametrize("transport", ["http", "grpc"])
def test_create_refused_before_the_server_listens_is_sent_again(two_servers, transport):
    # nothing listens at the address at first: the connection is refused, so nothing was
    # sent and even a create may go again (grpc says "failed to connect ... refused")
    a, _ = two_servers
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    target = a.http if transport == "http" else a.grpc
    proxies: list[LossyProxy] = []
    later = threading.Timer(0.4, lambda: proxies.append(LossyProxy(target, listen_port=port)))
    later.start()
    try:
        with EnvClient(
            f"127.0.0.1:{port}", transport=transport, token=TOKEN, retries=6, retry_wait=0.1
        ) as client:
            (reply,) = client.create(SessionOptions("sokoban", seed=1))
            assert reply.step_index == 0
            assert client.session_ids == [reply.session_id]
    finally:
        later.join()
        for proxy in proxies:
            proxy.close()


@pytest.mark.parametrize("transport", ["http", "grpc"])
def test_token_is_enforced(token_server, transport):
    address = token_server.http if transport == "http" else token_server.grpc
    for token in ("", "wrong-token"):
        with EnvClient(address, transport=transport, token=token) as client:
            with pytest.raises(Unauthenticated):
                client.list_envs()
            with pytest.raises(Unauthenticated):
                client.create(SessionOptions("sokoban"))
    with EnvClient(address, transport=transport, token=TOKEN) as client:
        (reply,) = client.create(SessionOptions("sokoban", seed=1))
        (stepped,) = client.step(reply.session_id, "<answer>Up</answer>")
        assert stepped.step_index == 1
    assert httpx.get(f"http://{token_server.http}/health").status_code == 200  # health stays open


def test_a_wrong_token_is_refused_on_every_call_of_fresh_clients(token_server):
    # the SDK's first call opens its Calls stream, which the server refuses; a call whose
    # write races that refusal must get UNAUTHENTICATED too, never a "broken stream"
    # UNAVAILABLE (1 call in 60 did, before such a call was sent again as a unary call)
    for _ in range(40):
        with EnvClient(token_server.grpc, token="wrong-token") as client:
            with pytest.raises(Unauthenticated):
                client.list_envs()
            with pytest.raises(Unauthenticated):
                client.create(SessionOptions("sokoban"))


def test_sync_clients_close_without_leaving_grpc_tasks_behind(token_server):
    # each sync EnvClient ends its own event loop; a call's grpc task still one turn from
    # done when the loop closed was destroyed pending, printing "Task was destroyed but
    # it is pending!" (and at times "Event loop is closed") at the exit of ~1 client in 3
    script = (
        "from clients import EnvClient, SessionOptions\n"
        "for _ in range(20):\n"
        f"    with EnvClient({token_server.grpc!r}, token={TOKEN!r}) as client:\n"
        "        client.create(SessionOptions('frozenlake'))\n"
        "print('ok')\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0 and done.stdout.strip() == "ok", done.stderr[-2000:]
    assert "Task was destroyed" not in done.stderr, done.stderr[-2000:]
    assert "Event loop is closed" not in done.stderr, done.stderr[-2000:]


def test_grpc_health_is_open_and_reflection_needs_the_token(token_server):
    with grpc.insecure_channel(token_server.grpc) as channel:
        health = health_pb2_grpc.HealthStub(channel)
        resp = health.Check(health_pb2.HealthCheckRequest(), timeout=10)
        assert resp.status == health_pb2.HealthCheckResponse.SERVING
        refl = reflection_pb2_grpc.ServerReflectionStub(channel)
        request = reflection_pb2.ServerReflectionRequest(list_services="")
        with pytest.raises(grpc.RpcError) as info:
            list(refl.ServerReflectionInfo(iter([request]), timeout=10))
        assert info.value.code() == grpc.StatusCode.UNAUTHENTICATED
        auth = (("authorization", f"Bearer {TOKEN}"),)
        (answer,) = list(refl.ServerReflectionInfo(iter([request]), timeout=10, metadata=auth))
        assert "visenv.v1.Visenv" in {s.name for s in answer.list_services_response.service}


def test_token_from_environment_variable(token_server, monkeypatch):
    monkeypatch.setenv("VISENV_TOKEN", TOKEN)
    with EnvClient(token_server.grpc) as client:
        assert "sokoban" in [e.name for e in client.list_envs()]


def test_typed_errors_per_item(two_servers):
    a, _ = two_servers
    with EnvClient(token=TOKEN, servers=a.grpc) as client:
        results = client.create(
            [
                SessionOptions("sokoban", seed=1),
                SessionOptions("no-such-env"),
                SessionOptions("sokoban", config={"num_boxes": 99}),
            ],
            return_exceptions=True,
        )
        assert results[0].session_id
        assert isinstance(results[1], NotFound) and results[1].code == "NOT_FOUND"
        assert isinstance(results[2], InvalidArgument) and "num_boxes" in (results[2].field or "")
        with pytest.raises(NotFound):
            client.create(SessionOptions("no-such-env"))


def test_unreachable_server_raises_unavailable_after_bounded_retries():
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # nothing listens here once closed
    for transport in ("http", "grpc"):
        with EnvClient(
            f"127.0.0.1:{port}", transport=transport, retries=2, retry_wait=0.01, timeout=5
        ) as client:
            with pytest.raises(Unavailable):
                client.list_envs()
            with pytest.raises(Unavailable):
                client.create(SessionOptions("sokoban"))


@pytest.mark.anyio
async def test_async_client_batches(two_servers):
    a, b = two_servers
    async with AsyncEnvClient(token=TOKEN, servers=[a.grpc, "http://" + b.http]) as client:
        replies = await client.create(
            [SessionOptions("frozenlake", seed=s, image_encoding="raw") for s in range(4)]
        )
        assert {client.server_of(r.session_id) for r in replies} == {a.grpc, "http://" + b.http}
        ids = [r.session_id for r in replies]
        arrays = [r.observation.images[0].to_array() for r in replies]
        assert all(isinstance(x, np.ndarray) and x.ndim == 3 for x in arrays)
        results = await client.step(
            ids + ["s-0000000000000000"], ["<answer>Down</answer>"] * 5, return_exceptions=True
        )
        assert all(r.step_index == 1 for r in results[:4])
        assert isinstance(results[4], NotFound)
        closed = await client.close(ids)
        assert closed == [None] * 4


# runs last: it kills the second server
def test_server_killed_mid_run(two_servers):
    survivor, victim = two_servers

    def policy(batch: list[PolicyInput]) -> list[str]:
        if batch[0].turn == 1 and victim.alive:
            victim.kill()
        return random_policy(batch)

    with EnvClient(
        token=TOKEN, servers=[survivor.grpc, victim.grpc], retries=2, retry_wait=0.05, timeout=10
    ) as client:
        # 6 sessions for 8 episodes: the slots lost with the victim are made again on
        # the survivor for the 2 waiting episodes
        trajs = client.run_episodes(policy, "sokoban", seeds=range(100, 108), max_turns=4, format="no_think",
                                    concurrency=6, on_error="record", progress=False)  # fmt: skip
    lost = [t for t in trajs if t.server == victim.grpc]
    kept = [t for t in trajs if t.server == survivor.grpc]
    assert lost and kept and len(lost) + len(kept) == 8
    for t in lost:
        assert isinstance(t.error, SessionLost) and not t.ok
        assert len(t.turns) == 1  # the turn before the kill; nothing made up after it
    for t in kept:
        assert t.ok and t.turns and (t.terminated or t.truncated)
        assert len(t.turns) <= 4
    assert all(t.ok and t.server == survivor.grpc for t in trajs[6:])  # the waiting ones ran
