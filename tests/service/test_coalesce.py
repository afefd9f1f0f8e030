"""Coalescing: concurrent single-session calls for one worker travel as one message.

In-process EnvService (one real worker process) for the exact mapping and failure cases,
and one end-to-end check through a real `visenv serve` over REST and gRPC.
"""

from __future__ import annotations

import asyncio

import httpx
import pytest

from env_server.service import EnvService, ServiceError, SessionReply, Settings
from env_server.testing import TINY_PATH, TinyEnv

# the test environment, by the import path the worker processes load it from
TINY = {TinyEnv.name: TINY_PATH}


def step(session_id: str, index: int, *names: str) -> dict:
    return {"session_id": session_id, "step_index": index, "actions": [{"name": n} for n in names]}


@pytest.fixture(scope="module")
def service(run) -> EnvService:
    svc = EnvService(Settings(workers=1, envs=["tiny", "sokoban"], env_paths=TINY))
    run(svc.start())
    yield svc
    run(svc.stop())


def test_concurrent_single_calls_share_messages_and_get_their_own_replies(run, service):
    async def main():
        # 24 sessions on corridors of different lengths, each with its own walk
        created = await service.create(
            [{"env": "tiny", "seed": 0, "config": {"length": 8 + n % 5}} for n in range(24)]
        )
        ids = [r.session_id for r in created]
        expected = {sid: 0 for sid in ids}
        worker = service.workers[0]
        before = (worker.messages_sent, worker.requests_sent)
        for turn in range(4):
            moves = {
                sid: ("Right", "Right") if (n + turn) % 3 else ("Right",)
                for n, sid in enumerate(ids)
            }
            replies = await asyncio.gather(
                *(service.step([step(sid, turn, *moves[sid])]) for sid in ids)
            )
            for sid, (reply,) in zip(ids, replies, strict=True):
                assert isinstance(reply, SessionReply), reply
                assert reply.session_id == sid and reply.step_index == turn + 1
                expected[sid] += len(moves[sid])
                assert reply.observation.ground_truth["player"] == [0, expected[sid]]
                assert reply.info["actions_executed"] == len(moves[sid])
        messages = worker.messages_sent - before[0]
        requests = worker.requests_sent - before[1]
        assert requests == 4 * 24
        assert messages <= 4 * 3, (messages, requests)  # ~2 a round: one alone, the rest
        health = await service.health()
        assert health["workers"][0]["messages"] < health["workers"][0]["requests"]
        await service.close(ids)

    run(main())


def test_a_window_gathers_company_under_concurrency_and_a_lone_request_goes_at_once(run, service):
    async def main():
        worker = service.workers[0]
        worker.coalesce_window, worker.coalesce_max_items = 0.2, 4
        try:
            ids = [r.session_id for r in await service.create([{"env": "tiny"}] * 6)]
            sent = worker.messages_sent
            # at most 4 items a message: 6 concurrent single steps -> 2 messages
            results = await asyncio.gather(*(service.step([step(s, 0, "Right")]) for s in ids))
            assert all(isinstance(r, SessionReply) and r.session_id == s
                       for (r,), s in zip(results, ids, strict=True))  # fmt: skip
            assert worker.messages_sent - sent == 2
            # a step then a close of the same session, queued together: applied in that order
            stepped, closed = await asyncio.gather(
                service.step([step(ids[0], 1, "Right")]), service.close([ids[0]])
            )
            assert isinstance(stepped[0], SessionReply) and closed == [None]
            # those bursts found the worker busy: concurrent traffic, so a request on the
            # idle worker now waits for company (the window) ...
            assert worker.concurrent(asyncio.get_running_loop().time())
            pending = asyncio.ensure_future(service.step([step(ids[1], 1, "Right")]))
            await asyncio.sleep(0.01)
            assert worker._timer is not None and not pending.done()
            assert isinstance((await pending)[0], SessionReply)
            # ... until the traffic has been quiet for CONCURRENT_SPAN: then a lone request
            # is sent at once
            await asyncio.sleep(worker.CONCURRENT_SPAN)
            assert not worker.concurrent(asyncio.get_running_loop().time())
            sent = worker.messages_sent
            pending = asyncio.ensure_future(service.step([step(ids[1], 2, "Right")]))
            await asyncio.sleep(0)
            await asyncio.sleep(0)
            assert worker._timer is None
            assert isinstance((await pending)[0], SessionReply)
            assert worker.messages_sent - sent == 1
            await service.close(ids[1:])
        finally:
            worker.coalesce_window, worker.coalesce_max_items = 0.01, 512

    run(main())


def test_worker_death_mid_coalesced_message_loses_each_item(run, service):
    async def main():
        created = await service.create([{"env": "tiny", "seed": 0}] * 6)
        ids = [r.session_id for r in created]
        worker = service.workers[0]
        sent = worker.messages_sent
        # a create of a few Sokoban rooms is in flight (alone) while the single steps
        # queue behind it; they go as one message, and one of them kills the worker
        create = asyncio.ensure_future(
            service.create([{"env": "sokoban", "seed": s} for s in range(6)])
        )
        await asyncio.sleep(0)
        steps = [step(sid, 0, "Right") for sid in ids]
        steps[3] = step(ids[3], 0, "Exit")
        results = await asyncio.gather(*(service.step([item]) for item in steps))
        assert all(isinstance(r, SessionReply) for r in await create)
        assert worker.messages_sent - sent == 2  # the create, then all six steps
        for sid, (result,) in zip(ids, results, strict=True):
            assert isinstance(result, ServiceError) and result.code == "SESSION_LOST", result
            assert (await service.get([sid]))[0].code == "SESSION_LOST"
        assert service.worker_restarts == 1

    run(main())


def test_end_to_end_concurrent_single_steps(start_visenv_server):
    """REST and gRPC single-session steps go through coalescing: sent while a batch create
    is in flight on the (one) worker, they queue and share messages."""
    from clients import AsyncEnvClient, SessionOptions

    server = start_visenv_server(workers=1, envs="sokoban")
    text = "<think>go</think><answer>Left</answer>"

    def counts() -> tuple[int, int]:
        (worker,) = httpx.get(server.url + "/health").json()["workers"]
        return worker["requests"], worker["messages"]

    async def main(transport: str) -> None:
        address = server.http if transport == "http" else server.grpc
        async with AsyncEnvClient(address, transport=transport, timeout=60) as client:
            options = [SessionOptions("sokoban", seed=s, format="free_think") for s in range(24)]
            ids = [r.session_id for r in await client.create(options[:16])]
            requests, messages = counts()
            if transport == "http":
                singles = rest_single_steps(server.url, ids, text)
            else:
                singles = asyncio.gather(*(client.step([sid], [text]) for sid in ids))
            created, out = await asyncio.gather(client.create(options[16:]), singles)
            if transport == "grpc":
                out = [reply for (reply,) in out]
            assert [r.session_id for r in out] == ids
            assert all(r.step_index == 1 and r.info["actions"] for r in out)
            requests_after, messages_after = counts()
            assert requests_after - requests == len(ids) + 1
            assert messages_after - messages < len(ids), (transport, counts())
            await client.close(ids + [r.session_id for r in created])

    for transport in ("http", "grpc"):
        asyncio.run(main(transport))


async def rest_single_steps(url: str, ids: list[str], text: str) -> list:
    """The first step of each session, each its own POST /v1/sessions/{id}/step, all at once."""
    from clients.types import SessionReply as ClientReply

    async with httpx.AsyncClient(timeout=60) as http:

        async def one(sid: str) -> ClientReply:
            resp = await http.post(
                f"{url}/v1/sessions/{sid}/step", json={"step_index": 0, "response": text}
            )
            assert resp.status_code == 200, resp.text
            return ClientReply.from_json(resp.json())

        return list(await asyncio.gather(*(one(sid) for sid in ids)))


def test_a_batchs_pieces_go_two_in_flight_in_order_with_others_between(run):
    """A worker's share of a batch goes in pieces, each sent before the answer of the one
    before it was read (the worker never waits on the API process), never more than two in
    flight; the answers come back in order, and a lone call made meanwhile is answered
    between pieces, in its own message."""

    async def main():
        svc = EnvService(
            Settings(workers=1, envs=["tiny"], env_paths=TINY, piece_items={"tiny": 4})
        )
        await svc.start()
        try:
            worker = svc.workers[0]
            sent: list[tuple[int, list[int]]] = []  # (in flight when sent, items per caller)
            send = worker._send

            def watched(entries):
                sent.append((worker._in_flight, [len(e.batch) for e in entries]))
                return send(entries)

            worker._send = watched
            ids = [
                r.session_id
                for r in await svc.create(
                    [{"env": "tiny", "seed": 0, "config": {"length": 8}}] * 13
                )
            ]
            lone, *batch = ids
            sent.clear()
            stepped = asyncio.ensure_future(
                svc.step([step(sid, 0, *["Right"] * (1 + n % 2)) for n, sid in enumerate(batch)])
            )
            while len(sent) < 2:
                await asyncio.sleep(0)
            (single,) = await svc.step([step(lone, 0, "Right")])
            replies = await stepped
            assert [r.session_id for r in replies] == batch
            assert [r.observation.ground_truth["player"] for r in replies] == [
                [0, 1 + n % 2] for n in range(12)
            ]
            assert single.observation.ground_truth["player"] == [0, 1]
            # 12 items: pieces of 4; the second sent while the first is in flight
            assert sent[0] == (0, [4]) and sent[1] == (1, [4]), sent
            assert max(flight for flight, _ in sent) <= 1  # two in flight at most
            assert sorted(items for _, items in sent) == [[1], [4], [4], [4]], sent
            assert sent[-1] != (1, [1])  # the lone call did not wait for the whole batch
        finally:
            await svc.stop()

    run(main())


def test_a_batchs_pieces_hold_about_twenty_milliseconds_of_work(run):
    """Pieces are sized by the time the worker takes per item, measured on the pieces
    before (per message type): creates that take 10 ms each go a few at a time after the
    first piece, so another session's call waits tens of milliseconds behind a batch,
    never a piece of 16 slow items; steps, not measured yet, still go 16 at a time."""

    async def main():
        svc = EnvService(
            Settings(workers=1, envs=["tiny"], env_paths=TINY, piece_items={"tiny": 16})
        )
        await svc.start()
        try:
            worker = svc.workers[0]
            sent: list[int] = []  # items per message
            send = worker._send

            def watched(entries):
                sent.append(sum(len(e.batch) for e in entries))
                return send(entries)

            worker._send = watched
            slow = {"env": "tiny", "config": {"reset_delay": 0.01}}
            created = await svc.create([{**slow, "seed": s} for s in range(40)])
            assert all(isinstance(r, SessionReply) for r in created), created
            # nothing measured yet: the configured size (the second piece goes before the
            # first is answered); then >= 10 ms an item: 2 at most (a busy machine: 1)
            assert sent[:2] == [16, 16] and max(sent[2:]) <= 2, sent
            assert sum(sent) == 40, sent
            sent.clear()
            ids = [r.session_id for r in created]
            replies = await svc.step([step(sid, 0, "Right") for sid in ids])
            assert [r.session_id for r in replies] == ids  # in order
            assert sent[0] == 16, sent  # a step's cost is measured apart from a create's
        finally:
            await svc.stop()

    run(main())
