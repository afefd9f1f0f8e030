"""The SDK splits a call bigger than the server's published limits (`max_batch_items`,
request bytes) into parts within them, in order, and closing the client closes every
session it opened, in parts too. A real server with the default limit (4,096 items)."""

from __future__ import annotations

import asyncio

import httpx
import pytest

from clients import ActionSpec, AsyncEnvClient, SessionOptions, SessionReply
from clients.transport import HttpTransport, SplittingTransport

N = 10_000


@pytest.fixture(scope="module")
def roomy_server():
    from env_server.testing.launcher import launch_server

    server = launch_server(workers=2, envs="tiny", max_sessions=N + 100)
    yield server
    server.stop()


@pytest.mark.parametrize("transport", ["grpc", "http"])
def test_ten_thousand_items_split_in_order_and_closed_on_exit(roomy_server, transport):
    address = roomy_server.grpc if transport == "grpc" else roomy_server.url
    limits = httpx.get(roomy_server.url + "/v1/limits").json()
    assert limits["max_batch_items"] == 4096 < N  # the default: one call could not hold N

    async def main() -> None:
        async with AsyncEnvClient([address], transport=transport, timeout=300) as client:
            seeds = [i % 500 for i in range(N)]  # (666-668 are the tiny env's failures)
            created = await client.create([SessionOptions("tiny", seed=s) for s in seeds])
            assert all(isinstance(r, SessionReply) for r in created)
            length = created[0].observation.ground_truth["goal"][1] + 1
            starts = [r.observation.ground_truth["player"][1] for r in created]
            assert starts == [s % (length - 1) for s in seeds]  # in order
            ids = [r.session_id for r in created]
            assert len(set(ids)) == N
            stepped = await client.step_actions(ids, [[ActionSpec("Left")]] * N)
            assert [r.session_id for r in stepped] == ids
            assert [r.observation.ground_truth["player"][1] for r in stepped] == [
                max(0, p - 1) for p in starts
            ]
            got = await client.get(ids[::-1])
            assert [r.session_id for r in got] == ids[::-1]
            assert len(client.session_ids) == N
        # leaving `async with` closed them all (10,000 ids: three parts)
        health = httpx.get(roomy_server.url + "/health").json()
        assert health["sessions"] == 0, health["sessions"]

    asyncio.run(main())


def test_parts_stay_within_the_request_bytes(roomy_server):
    """A server with the default item limit but a small byte budget is sent parts under it."""
    sizes: list[int] = []

    class Recording(HttpTransport):
        async def step(self, items):
            sizes.append(len(items))
            return await super().step(items)

    async def main() -> None:
        transport = SplittingTransport(Recording(roomy_server.url, None, 60))
        transport._limits = (4096, 20_000)  # as if the server published 25,000 bytes
        created = await transport.create([SessionOptions("tiny", seed=1) for _ in range(300)])
        ids = [r.session_id for r in created]
        from visenv.wire import StepItem

        long = "<answer>Right</answer>" + " " * 200
        replies = await transport.step([StepItem(sid, 0, response=long) for sid in ids])
        assert all(isinstance(r, SessionReply) for r in replies)
        assert [r.session_id for r in replies] == ids
        assert len(sizes) > 1 and sum(sizes) == 300 and max(sizes) < 100, sizes
        assert await transport.close(ids) == [None] * 300
        await transport.aclose()

    asyncio.run(main())


def test_step_actions_takes_names_and_refuses_a_bare_list_with_a_clear_error(roomy_server):
    """`[["Left"]]` is ActionSpec("Left"); `["Left"]` (one session's actions without the
    outer list) is a TypeError that shows the right shape, not an AttributeError."""

    async def main() -> None:
        async with AsyncEnvClient([roomy_server.grpc]) as client:
            (made,) = await client.create([SessionOptions("tiny", seed=3)])
            sid, start = made.session_id, made.observation.ground_truth["player"][1]
            (by_name,) = await client.step_actions(sid, [["Left"]])
            assert by_name.observation.ground_truth["player"][1] == max(0, start - 1)
            with pytest.raises(TypeError, match=r"actions\[0\] must be a list .*\['Left'\]"):
                await client.step_actions(sid, ["Left"])
            with pytest.raises(TypeError, match=r"an action is an ActionSpec or a name"):
                await client.step_actions(sid, [[{"name": "Left"}]])
            (again,) = await client.step_actions(sid, [[ActionSpec("Right")]])
            assert again.step_index == 2  # the refused calls sent nothing

    asyncio.run(main())
