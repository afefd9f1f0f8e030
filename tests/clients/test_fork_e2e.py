"""Session fork over every transport against real `visenv serve` processes: REST (single and
batch), gRPC, the sync and async SDK, and a gateway in front of two replicas."""

from __future__ import annotations

import pytest

from clients import (
    AsyncEnvClient,
    CapacityError,
    EnvClient,
    FailedPrecondition,
    InvalidArgument,
    NotFound,
    PolicyInput,
    SessionOptions,
)
from clients.rollout import run_branches
from env_server.testing.launcher import VisenvServer, launch_server, launch_servers

RIGHT = "<answer>Right</answer>"


@pytest.fixture(scope="module")
def servers() -> list[VisenvServer]:
    """A small server (cap 6) and two sokoban replicas behind a gateway."""
    small, one, two = launch_servers(
        dict(workers=1, envs="sokoban,tiny", max_sessions=6),
        dict(workers=1, envs="sokoban"),
        dict(workers=1, envs="sokoban"),
    )
    gateway = launch_server(envs=None, upstreams=[one.grpc, two.grpc])
    yield [small, one, two, gateway]
    for server in (gateway, small, one, two):
        server.stop()


def test_rest_fork_single_and_batch(servers):
    small = servers[0]
    with small.client() as http:
        made = http.post("/v1/sessions", json={"env": "tiny", "seed": 0, "format": "no_think",
                                               "config": {"length": 8}}).json()  # fmt: skip
        sid = made["session_id"]
        http.post(f"/v1/sessions/{sid}/step", json={"step_index": 0, "response": RIGHT})
        resp = http.post(f"/v1/sessions/{sid}/fork", json={"n": 2})
        assert resp.status_code == 200, resp.text
        replies = resp.json()["replies"]
        assert len(replies) == 2 and {r["session_id"] for r in replies}.isdisjoint({sid})
        for reply in replies:
            assert reply["step_index"] == 1 and reply["observation"]["ground_truth"]["player"] == [
                0,
                1,
            ]
            assert reply["info"]["fork"] == {"source": sid, "exact": True, "tolerance": None}
        fid = replies[0]["session_id"]
        stepped = http.post(f"/v1/sessions/{fid}/step", json={"step_index": 1, "response": RIGHT})
        assert stepped.json()["observation"]["ground_truth"]["player"] == [0, 2]
        assert http.get(f"/v1/sessions/{sid}").json()["observation"]["ground_truth"]["player"] == [
            0, 1,
        ]  # fmt: skip
        (single,) = http.post(f"/v1/sessions/{sid}/fork").json()["replies"]  # no body: n=1
        bad = http.post(f"/v1/sessions/{sid}/fork", json={"n": 0})
        assert bad.status_code == 422 and bad.json()["error"]["field"] == "n"
        assert http.post("/v1/sessions/s-nope/fork", json={"n": 1}).status_code == 404
        # the cap is 6 and 4 are open: 3 more are refused whole, in their own item
        results = http.post("/v1/batch/fork", json={"items": [
            {"session_id": sid, "n": 3}, {"session_id": sid, "n": 0}]}).json()["results"]  # fmt: skip
        assert results[0]["ok"] is False and results[0]["error"]["code"] == "CAPACITY"
        assert results[1]["error"]["code"] == "INVALID_ARGUMENT"
        assert http.get("/health").json()["sessions"] == 4
        over = http.post(f"/v1/sessions/{sid}/fork", json={"n": 3})
        assert over.status_code == 429 and over.json()["error"]["code"] == "CAPACITY"
        ok = http.post("/v1/batch/fork", json={"items": [{"session_id": fid, "n": 2}]}).json()
        assert [len(r["replies"]) for r in ok["results"]] == [2]
        made_ids = [r["session_id"] for r in replies + ok["results"][0]["replies"]]
        http.post("/v1/batch/close", json={"session_ids": [sid, single["session_id"], *made_ids]})
        assert http.get("/health").json()["sessions"] == 0


@pytest.mark.parametrize("transport", ["grpc", "http"])
def test_sdk_fork_answers_like_the_source(servers, transport):
    small = servers[0]
    address = small.grpc if transport == "grpc" else small.url
    with EnvClient(address, transport=transport) as client:
        (source,) = client.create(_options(seed=2))
        sid = source.session_id
        client.step([sid], [RIGHT])
        forks = client.fork(sid, 2)
        assert [f.step_index for f in forks] == [1, 1]
        assert all(client.next_step_index(f.session_id) == 1 for f in forks)
        ids = [sid] + [f.session_id for f in forks]
        after = client.step(ids, [RIGHT] * 3)
        assert (
            len({(r.observation.text, r.reward, r.observation.images[0].data) for r in after}) == 1
        )
        with pytest.raises(CapacityError):
            client.fork(sid, 4)  # 3 open, cap 6
        results = client.fork_many([sid, "s-0000000000000000"], [1, 1], return_exceptions=True)
        assert len(results[0]) == 1 and isinstance(results[1], NotFound)
        with pytest.raises(InvalidArgument):
            client.fork(sid, 0)
        assert len(client.session_ids) == 4
    with small.client() as http:
        assert http.get("/health").json()["sessions"] <= 1  # the client closed what it made


@pytest.mark.anyio
async def test_async_client_fork(servers):
    small = servers[0]
    async with AsyncEnvClient(small.grpc) as client:
        (source,) = await client.create(_options(seed=1))
        forks = await client.fork(source.session_id, 1)
        (a, b) = await client.step([source.session_id, forks[0].session_id], [RIGHT, RIGHT])
        assert a.observation.ground_truth == b.observation.ground_truth
        assert client.server_of(forks[0].session_id) == client.server_of(source.session_id)


def test_gateway_fork_lands_on_the_sources_replica(servers):
    _, one, two, gateway = servers
    with EnvClient(gateway.grpc) as client:
        sources = client.create([_options("sokoban", seed=s) for s in range(2)])
        ids = [s.session_id for s in sources]
        where = {}
        for replica in (one, two):
            with replica.client() as http:
                for sid in ids:
                    if http.get(f"/v1/sessions/{sid}").status_code == 200:
                        where[sid] = replica
        assert set(where) == set(ids) and {where[s].url for s in ids} == {one.url, two.url}
        forked = client.fork_many(ids, 2)
        for sid, forks in zip(ids, forked, strict=True):
            with where[sid].client() as http:  # on the source's replica, under the same id
                for fork in forks:
                    got = http.get(f"/v1/sessions/{fork.session_id}")
                    assert got.status_code == 200 and got.json()["info"]["fork"]["source"] == sid
        moved = client.step([ids[0], forked[0][0].session_id], ["<answer>Left</answer>"] * 2)
        assert moved[0].observation.text == moved[1].observation.text
        assert moved[0].observation.images[0].data == moved[1].observation.images[0].data
    with gateway.client() as http:
        assert http.get("/health").json()["sessions"] == 0  # forks closed through it too


def member_policy(batch: list[PolicyInput]) -> list[str]:
    """Right, except that the second episode of each group of 3 goes Left on turn 0; a
    fixed response start ("<answer>Le") is completed to Left."""
    out = []
    for p in batch:
        if p.response_prefix:
            out.append(p.response_prefix + "ft</answer>")
        else:
            move = "Left" if p.episode % 3 == 1 and p.turn == 0 else "Right"
            out.append(f"<answer>{move}</answer>")
    return out


def test_group_episodes_start_from_one_forked_state(servers):
    small = servers[0]  # cap 6: two groups of 3 at a time, or the forks would be refused
    with EnvClient(small.grpc) as client:
        trajs = client.run_episodes(
            member_policy, "tiny", seeds=[1, 2, 3, 5], group_size=3, concurrency=6,
            config={"length": 5}, format="no_think", max_turns=6, progress=False,
        )  # fmt: skip
        assert client.session_ids == []
    assert [(t.episode, t.group, t.seed) for t in trajs] == [
        (g * 3 + j, g, seed) for g, seed in enumerate([1, 2, 3, 5]) for j in range(3)
    ]
    for g in range(4):
        group = trajs[g * 3 : g * 3 + 3]
        assert all(t.ok for t in group), [t.error for t in group]
        first = {(t.turns[0].prompt, t.turns[0].images[0].data) for t in group}
        assert len(first) == 1 and group[0].system_prompt  # one start state, with the prompt
        assert len({t.session_id for t in group}) == 3
        # the member that stepped Left first needs two more turns
        assert len(group[1].turns) == len(group[0].turns) + 2 == len(group[2].turns) + 2
        assert all(t.success for t in group)


@pytest.mark.anyio
async def test_branches_replay_or_fork_a_kept_session(servers):
    small = servers[0]
    async with AsyncEnvClient(small.grpc) as client:
        (source,) = await client.run_episodes(
            member_policy, "tiny", seeds=[0], config={"length": 5}, format="no_think",
            progress=False,
        )  # fmt: skip
        assert len(source.turns) == 4 and source.success
        prefix = "<answer>Le"  # a fixed start: the policy completes it
        branches = await run_branches(
            client, member_policy, source, turn=2, n=2, response_prefix=prefix,
            config={"length": 5}, format="no_think",
        )  # fmt: skip
        for branch in branches:
            assert branch.branched_at == 2 and branch.turns[:2] == source.turns[:2]
            assert branch.turns[2].response == "<answer>Left</answer>"
            assert branch.turns[2].ground_truth == source.turns[2].ground_truth
            assert branch.turns[3].ground_truth["player"] == [0, 1]  # it went back
            assert branch.success and len(branch.turns) == 6
        # replaying under other options diverges: said, not hidden
        with pytest.raises(FailedPrecondition):
            await run_branches(client, member_policy, source, turn=2, n=1,
                               config={"length": 6}, format="no_think")  # fmt: skip
        # from a kept session: it is forked and left as it was
        (kept,) = await client.create(_options(seed=0))
        await client.step([kept.session_id], ["<answer>Right</answer>"])
        more = await run_branches(client, member_policy, source, turn=1, n=2,
                                  session_id=kept.session_id)  # fmt: skip
        assert all(b.success and b.turns[1].ground_truth["player"] == [0, 1] for b in more)
        (same,) = await client.get([kept.session_id])
        assert same.step_index == 1
        assert client.session_ids == [kept.session_id]


def _options(env: str = "tiny", seed: int = 0) -> SessionOptions:
    config = {"length": 8} if env == "tiny" else {}
    return SessionOptions(env, seed=seed, config=config, format="no_think")
