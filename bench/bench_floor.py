"""What each per-session transport costs the server per call before any of visenv's work,
and so the least server CPU a served per-session step can cost on this machine.

A server process serves, on one event loop as `visenv serve` does (uvicorn with httptools
and grpc.aio side by side, no uvloop), handlers that do nothing but answer a fixed reply:

- gRPC unary `Step` (a one-item `StepRequest`; the answer, an empty `BatchResponse` item);
- gRPC, one message on a `Calls`-shaped bidirectional stream (what the SDK sends);
- REST, `POST /v1/sessions/{id}/step` on a bare ASGI app (no FastAPI, no middleware);
- a WebSocket message answered by one message (OpenEnv's per-session protocol).

This process runs `--clients` concurrent clients, each with its own connection (grpc.aio
channel, httpx client, websockets connection, as the SDK and OpenEnv's client do), sending
as fast as answers come back. Per variant: calls/s and CPU microseconds per call of the
server process and of the clients. Then the in-process step of the reference workload
(bench_transport's, batch 64, PNG) and, per transport, the floor: the transport's own cost
plus the step. No served per-session step can cost the server less than that, whatever the
server does between them; issue 44's target is 350 us (0.35 s per 1,000 env-steps).

    python bench/bench_floor.py                 # 64 clients, 8 s per variant
    python bench/bench_floor.py --rounds 2      # alternate the variants
    python bench/bench_floor.py --only grpc-unary grpc-stream
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

import grpc
import httpx
import uvicorn
import websockets

sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_transport import ServerCPU, bench_in_process, client_cpu  # noqa: E402

from visenv.v1 import visenv_pb2 as pb  # noqa: E402
from visenv.v1 import visenv_pb2_grpc as pb_grpc  # noqa: E402

STREAM = "/bench.Floor/Calls"
VARIANTS = ("grpc-unary", "grpc-stream", "rest", "websocket")
TARGET_US = 350.0  # issue 44: <= 0.35 s of server CPU per 1,000 per-session env-steps
STEP_BODY = json.dumps({"response": "<answer>Left</answer>", "step_index": 1}).encode()
STEP_ARGS = {"warmup": 30, "trials": 3, "steps": 30}  # bench_transport's defaults
REPLY = json.dumps({"session_id": "s-0", "step_index": 1, "reward": 0.0, "done": False}).encode()


# ---- the server: handlers that do nothing ----------------------------------------------


class Unary(pb_grpc.VisenvServicer):
    async def Step(self, request, context):
        return pb.BatchResponse(results=[pb.BatchItem() for _ in request.items])


async def calls(requests, context):
    async for request in requests:
        yield pb.BatchResponse(results=[pb.BatchItem() for _ in request.items])


async def asgi(scope, receive, send) -> None:
    """POST anything: read the body, answer REPLY. A WebSocket: answer each message."""
    if scope["type"] == "http":
        more = True
        while more:
            more = (await receive()).get("more_body", False)
        headers = [(b"content-type", b"application/json"), (b"content-length", b"%d" % len(REPLY))]
        await send({"type": "http.response.start", "status": 200, "headers": headers})
        await send({"type": "http.response.body", "body": REPLY})
    elif scope["type"] == "websocket":
        await receive()  # websocket.connect
        await send({"type": "websocket.accept"})
        while (await receive())["type"] == "websocket.receive":
            await send({"type": "websocket.send", "text": REPLY.decode()})


async def serve() -> None:
    server = grpc.aio.server()
    pb_grpc.add_VisenvServicer_to_server(Unary(), server)
    handler = grpc.stream_stream_rpc_method_handler(
        calls,
        request_deserializer=pb.StepRequest.FromString,
        response_serializer=pb.BatchResponse.SerializeToString,
    )
    server.add_generic_rpc_handlers(
        (grpc.method_handlers_generic_handler("bench.Floor", {"Calls": handler}),)
    )
    grpc_port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    config = uvicorn.Config(
        asgi, host="127.0.0.1", port=0, http="httptools", ws="websockets", lifespan="off",
        log_level="warning", access_log=False,
    )  # fmt: skip
    http = uvicorn.Server(config)
    http.install_signal_handlers = lambda: None  # type: ignore[method-assign]
    task = asyncio.create_task(http.serve())
    while not http.started:
        await asyncio.sleep(0.01)
    http_port = http.servers[0].sockets[0].getsockname()[1]
    print(grpc_port, http_port, flush=True)
    await task


# ---- the clients ---------------------------------------------------------------------------


async def client_loop(kind: str, grpc_address: str, http_url: str, stop: asyncio.Event,
                      count: list[int]) -> None:  # fmt: skip
    request = pb.StepRequest(
        items=[pb.StepItem(session_id="s-0", step_index=1, response="<answer>Left</answer>")]
    )
    if kind == "grpc-unary":
        async with grpc.aio.insecure_channel(grpc_address) as channel:
            stub = pb_grpc.VisenvStub(channel)
            while not stop.is_set():
                await stub.Step(request)
                count[0] += 1
    elif kind == "grpc-stream":
        async with grpc.aio.insecure_channel(grpc_address) as channel:
            call = channel.stream_stream(
                STREAM,
                request_serializer=pb.StepRequest.SerializeToString,
                response_deserializer=pb.BatchResponse.FromString,
            )()
            while not stop.is_set():
                await call.write(request)
                await call.read()
                count[0] += 1
            await call.done_writing()
    elif kind == "rest":
        async with httpx.AsyncClient(base_url=http_url) as client:
            while not stop.is_set():
                reply = await client.post("/v1/sessions/s-0/step", content=STEP_BODY,
                                          headers={"content-type": "application/json"})  # fmt: skip
                reply.raise_for_status()
                count[0] += 1
    else:
        url = http_url.replace("http://", "ws://") + "/ws"
        async with websockets.connect(url, max_size=None) as ws:
            while not stop.is_set():
                await ws.send(STEP_BODY.decode())
                await ws.recv()
                count[0] += 1


async def measure(kind: str, grpc_address: str, http_url: str, server: ServerCPU,
                  args: argparse.Namespace) -> tuple[float, float, float]:  # fmt: skip
    """calls/s, server and client CPU us per call."""
    count, stop = [0], asyncio.Event()
    tasks = [asyncio.create_task(client_loop(kind, grpc_address, http_url, stop, count))
             for _ in range(args.clients)]  # fmt: skip
    await asyncio.sleep(args.warmup_s)
    n0, s0, c0, t0 = count[0], server.seconds(), client_cpu(), time.perf_counter()
    await asyncio.sleep(args.seconds)
    n = count[0] - n0
    rate = n / (time.perf_counter() - t0)
    server_us = (server.seconds() - s0) / n * 1e6
    client_us = (client_cpu() - c0) / n * 1e6
    stop.set()
    await asyncio.gather(*tasks)
    return rate, server_us, client_us


async def run(args: argparse.Namespace) -> None:
    proc = subprocess.Popen([sys.executable, __file__, "--serve"], stdout=subprocess.PIPE,
                            text=True)  # fmt: skip
    floors: dict[str, list[float]] = {k: [] for k in args.only}
    try:
        grpc_port, http_port = proc.stdout.readline().split()
        address, url = f"127.0.0.1:{grpc_port}", f"http://127.0.0.1:{http_port}"
        server = ServerCPU(proc.pid)
        for _ in range(args.rounds):
            for kind in args.only:
                rate, server_us, client_us = await measure(kind, address, url, server, args)
                floors[kind].append(server_us)
                print(f"{kind:12} {rate:8,.0f} calls/s   server {server_us:5.0f} us/call   "
                      f"clients {client_us:5.0f} us/call", flush=True)  # fmt: skip
    finally:
        proc.kill()
        proc.wait()
    if args.no_step:
        return
    steps = [
        (await bench_in_process(64, "png", argparse.Namespace(**STEP_ARGS))).client_cpu * 1e3
        for _ in range(args.rounds)
    ]  # fmt: skip
    step = statistics.median(steps)
    print(f"in-process step (batch 64, PNG): {', '.join(f'{s:.0f}' for s in steps)} us/step")
    for kind, us in floors.items():
        floor = statistics.median(us) + step
        verdict = "under" if floor <= TARGET_US else "over"
        print(f"floor {kind:12} {statistics.median(us):4.0f} + {step:.0f} = {floor:4.0f} us per "
              f"per-session step ({floor / 1e3:.2f} s/1k): {verdict} the {TARGET_US:.0f} us target")  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--clients", type=int, default=64)
    parser.add_argument("--seconds", type=float, default=8.0)
    parser.add_argument("--warmup-s", type=float, default=2.0)
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--only", nargs="+", choices=VARIANTS, default=list(VARIANTS))
    parser.add_argument("--no-step", action="store_true", help="skip the in-process step")
    parser.add_argument("--serve", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    asyncio.run(serve() if args.serve else run(args))


if __name__ == "__main__":
    main()
