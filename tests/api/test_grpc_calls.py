"""Visenv.Calls: many calls over one bidirectional stream, each answered under its id with
what its unary call answers (or the error that call would end with), and the SDK's
`wire.Channel` that sends small calls that way.

Against the shared real server: the raw generated stub, and the Channel. In-process peers
only where a real server can't show the case on demand: a server that lacks `Calls` (an
older visenv, or another implementation) and one that never answers (a deadline)."""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator

import grpc
import pytest

from env_server.api.grpc_server import VisenvServicer
from visenv import wire
from visenv.v1 import visenv_pb2 as pb
from visenv.v1 import visenv_pb2_grpc as pb_grpc


@pytest.fixture(scope="module")
def stub(visenv_server):
    with grpc.insecure_channel(visenv_server.grpc) as channel:
        yield pb_grpc.VisenvStub(channel)


def _calls(stub, *requests: pb.CallRequest) -> dict[int, pb.CallResponse]:
    """Send `requests` on one stream (closed after the last); its answers by id."""
    answers = list(stub.Calls(iter(requests), timeout=60))
    by_id = {a.id: a for a in answers}
    assert len(by_id) == len(answers) == len(requests), answers
    return by_id


def test_calls_answer_each_request_under_its_id_as_the_unary_calls_do(stub):
    options = pb.SessionOptions(env="sokoban", seed=11, format="no_think")
    created = _calls(
        stub,
        pb.CallRequest(id=7, create=pb.CreateRequest(items=[options])),
        pb.CallRequest(id=8, list_envs=pb.ListEnvsRequest()),
        pb.CallRequest(id=9, status=pb.StatusRequest()),
    )
    assert created.keys() == {7, 8, 9}
    (on_stream,) = created[7].batch.results
    assert "sokoban" in {e.name for e in created[8].list_envs.envs}
    assert json.loads(created[9].status.status_json)["status"] == "ok"
    (unary,) = stub.Create(pb.CreateRequest(items=[options]), timeout=60).results
    a, b = on_stream.reply, unary.reply
    try:
        assert a.observation.images[0].data == b.observation.images[0].data
        assert a.observation.ground_truth_json == b.observation.ground_truth_json
        step = pb.StepItem(step_index=0, response="<answer>Left</answer>")
        step.session_id = a.session_id
        stepped = _calls(stub, pb.CallRequest(id=1, step=pb.StepRequest(items=[step])))
        step.session_id = b.session_id
        (unary_step,) = stub.Step(pb.StepRequest(items=[step]), timeout=60).results
        (stream_step,) = stepped[1].batch.results
        assert stream_step.reply.step_index == unary_step.reply.step_index == 1
        assert stream_step.reply.reward == unary_step.reply.reward
        assert (
            stream_step.reply.observation.images[0].data
            == unary_step.reply.observation.images[0].data
        )
        # a re-sent step (same step_index, same body) is answered from memory, as unary
        resent = _calls(stub, pb.CallRequest(id=2, step=pb.StepRequest(items=[step])))
        assert resent[2].batch.results[0].reply.step_index == 1
        closed = _calls(
            stub,
            pb.CallRequest(id=3, close=pb.CloseRequest(session_ids=[a.session_id])),
            pb.CallRequest(id=4, frame=pb.FrameRequest(session_ids=[b.session_id])),
        )
        assert not closed[3].close.results[0].HasField("error")
        assert closed[4].frame.results[0].png.startswith(b"\x89PNG")
    finally:
        stub.Close(pb.CloseRequest(session_ids=[a.session_id, b.session_id]), timeout=30)


def test_a_failed_call_answers_its_error_and_the_stream_goes_on(stub, visenv_server):
    limits = json.loads(stub.ListEnvs(pb.ListEnvsRequest(), timeout=30).limits_json)
    too_many = limits["max_batch_items"] + 1
    answers = _calls(
        stub,
        pb.CallRequest(id=1),  # no call in it
        pb.CallRequest(id=2, get=pb.GetRequest(session_ids=["s-nope"] * too_many)),
        pb.CallRequest(id=3, get=pb.GetRequest(session_ids=["s-nope"])),
        pb.CallRequest(id=4, status=pb.StatusRequest()),
    )
    empty, over, unknown, status = (answers[i] for i in (1, 2, 3, 4))
    assert empty.error.code == "INVALID_ARGUMENT" and empty.error.field == "call"
    assert "carries no call" in empty.error.message
    assert over.error.code == "INVALID_ARGUMENT" and str(too_many) in over.error.message
    assert unknown.batch.results[0].error.code == "NOT_FOUND"  # a per-item error, as unary
    assert json.loads(status.status.status_json)["status"] == "ok"
    # the same batch as a unary call fails the same way, as a status
    with pytest.raises(grpc.RpcError) as info:
        stub.Get(pb.GetRequest(session_ids=["s-nope"] * too_many), timeout=30)
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT


def test_channel_sends_small_calls_on_the_stream_and_big_ones_unary(visenv_server):
    async def main() -> None:
        channel = wire.Channel(visenv_server.grpc, None, 60)
        try:
            small = pb.GetRequest(session_ids=["s-nope"])
            (item,) = (await channel.call("Get", small)).results
            assert item.error.code == "NOT_FOUND"
            stream = channel._calls
            assert stream is not None and not stream.over
            sent = next(stream.ids)
            big = pb.GetRequest(session_ids=["s-" + "0" * 30] * 3000)
            assert big.ByteSize() > wire.STREAM_MAX_BYTES
            answers = (await channel.call("Get", big)).results
            assert len(answers) == 3000 and answers[0].error.code == "NOT_FOUND"
            assert next(stream.ids) == sent + 1  # the big one did not go on the stream
            # many at once on one stream, each answered with its own reply
            ids = [f"s-missing-{i}" for i in range(50)]
            got = await asyncio.gather(
                *(channel.call("Get", pb.GetRequest(session_ids=[s])) for s in ids)
            )
            assert all(s in g.results[0].error.message for s, g in zip(ids, got, strict=True))
            assert channel._calls is stream
        finally:
            await channel.aclose()

    asyncio.run(main())


class _NoCalls(pb_grpc.VisenvServicer):
    """A peer without `Calls` (the generated base answers UNIMPLEMENTED): an older visenv
    server, or another implementation of the unary contract."""

    async def Status(self, request, context):
        return pb.StatusResponse(status_json='{"status": "ok", "peer": "old"}')


class _Silent(pb_grpc.VisenvServicer):
    """A peer whose calls never answer (stuck): the deadline must still hold."""

    async def Calls(self, requests, context):
        async for _ in requests:
            pass
        await asyncio.sleep(3600)
        yield pb.CallResponse()  # never reached

    async def Status(self, request, context):
        await asyncio.sleep(3600)


class _Health:
    """The one service method Status needs (for the end_streams case)."""

    async def health(self) -> dict:
        return {"status": "ok"}


@contextlib.asynccontextmanager
async def _peer(servicer, timeout: float) -> AsyncIterator[wire.Channel]:
    """`servicer` served in-process on a free 127.0.0.1 port; a Channel to it."""
    server = grpc.aio.server()
    pb_grpc.add_VisenvServicer_to_server(servicer, server)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    channel = wire.Channel(f"127.0.0.1:{port}", None, timeout)
    try:
        yield channel
    finally:
        await channel.aclose()
        await server.stop(None)


def test_channel_falls_back_to_unary_calls_on_a_server_without_calls():
    async def main() -> None:
        async with _peer(_NoCalls(), 10) as channel:
            for _ in range(2):
                reply = await channel.call("Status", pb.StatusRequest())
                assert json.loads(reply.status_json)["peer"] == "old"
            assert channel.stream is False

    asyncio.run(main())


def test_a_stream_call_keeps_its_deadline():
    async def main() -> None:
        async with _peer(_Silent(), 0.5) as channel:
            with pytest.raises(grpc.aio.AioRpcError) as info:
                await channel.call("Status", pb.StatusRequest())
            assert info.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
            assert channel._calls is not None and not channel._calls.pending

    asyncio.run(main())


def test_a_stopping_server_ends_its_streams_and_the_channel_opens_a_new_one():
    async def main() -> None:
        servicer = VisenvServicer(_Health())  # type: ignore[arg-type]
        async with _peer(servicer, 10) as channel:
            await channel.call("Status", pb.StatusRequest())
            first = channel._calls
            assert first is not None and len(servicer._streams) == 1
            servicer.end_streams()
            await asyncio.wait_for(asyncio.shield(first.reader), 5)
            assert first.over and first.error.code() == grpc.StatusCode.UNAVAILABLE
            reply = await channel.call("Status", pb.StatusRequest())
            assert json.loads(reply.status_json) == {"status": "ok"}
            assert channel._calls is not first and not channel._calls.over

    asyncio.run(main())


class _Gated(_Health):
    """Status calls that wait for the test to open the gate."""

    def __init__(self) -> None:
        self.gate = asyncio.Event()
        self.waiting = 0

    async def health(self) -> dict:
        self.waiting += 1
        await self.gate.wait()
        return {"status": "ok"}


def test_a_stream_holds_at_most_its_cap_of_calls_in_flight_and_answers_them_all():
    from env_server.api.grpc_server import STREAM_MAX_CALLS

    async def main() -> None:
        service = _Gated()
        servicer = VisenvServicer(service)  # type: ignore[arg-type]
        async with _peer(servicer, 30) as channel:
            n = STREAM_MAX_CALLS + 40
            calls = [
                asyncio.ensure_future(channel.call("Status", pb.StatusRequest())) for _ in range(n)
            ]
            for _ in range(200):  # until the server has read all it may
                await asyncio.sleep(0.05)
                if service.waiting >= STREAM_MAX_CALLS:
                    break
            await asyncio.sleep(0.3)
            (stream,) = servicer._streams
            assert service.waiting == len(stream.running) == STREAM_MAX_CALLS
            service.gate.set()
            replies = await asyncio.gather(*calls)
            assert len(replies) == n and service.waiting == n

    asyncio.run(main())


async def _refuse(context) -> None:
    await context.abort(
        grpc.StatusCode.UNAUTHENTICATED,
        "no",
        trailing_metadata=((wire.CODE_METADATA_KEY, "UNAUTHENTICATED"),),
    )


class _Refusing(pb_grpc.VisenvServicer):
    """A peer that refuses every call at once, as the token check does."""

    async def Calls(self, requests, context):
        await _refuse(context)
        yield pb.CallResponse()  # never reached

    async def Status(self, request, context):
        await _refuse(context)


def test_a_refused_stream_answers_its_status_to_every_call_never_a_broken_stream():
    # grpc reports a write racing the server's refusal as INTERNAL "Internal error from
    # Core" and puts that in place of the call's real status: a call whose request never
    # went out must still get the real answer
    async def main() -> None:
        async with _peer(_Refusing(), 10) as channel:
            for _ in range(30):
                with pytest.raises(grpc.aio.AioRpcError) as info:
                    await channel.call("Status", pb.StatusRequest())
                assert info.value.code() == grpc.StatusCode.UNAUTHENTICATED
                assert wire.rpc_error_code(info.value) == "UNAUTHENTICATED"

    asyncio.run(main())
