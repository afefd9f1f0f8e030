"""grpc.aio's own cost per call, before any of visenv's work: a unary call against one
message on a bidirectional stream (what `Visenv.Calls` carries), with handlers that do
nothing but answer.

A server process serves both on 127.0.0.1 with a trivial handler (the answer is an empty
`BatchResponse` item per request item); this process runs `--clients` concurrent clients,
each with its own channel, sending a one-item `StepRequest` as fast as answers come back:
as unary `Step` calls, then as messages on one `Calls`-shaped stream per client. Reported
per variant: calls/s and CPU microseconds per call of the server process and of this
process (the clients). The difference is what a per-session agent loop saves per step by
using the stream (docs/experiments/2026-12-02-issue-28-cheaper-step.md, "per-session gRPC over one stream").

    python bench/bench_grpc_floor.py                 # 64 clients, 8 s per variant
    python bench/bench_grpc_floor.py --rounds 2      # alternate the variants
"""

from __future__ import annotations

import argparse
import asyncio
import subprocess
import sys
import time
from pathlib import Path

import grpc

sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_transport import ServerCPU, client_cpu  # noqa: E402

from visenv.v1 import visenv_pb2 as pb  # noqa: E402
from visenv.v1 import visenv_pb2_grpc as pb_grpc  # noqa: E402

STREAM = "/bench.Floor/Calls"


class Unary(pb_grpc.VisenvServicer):
    async def Step(self, request, context):
        return pb.BatchResponse(results=[pb.BatchItem() for _ in request.items])


async def calls(requests, context):
    async for request in requests:
        yield pb.BatchResponse(results=[pb.BatchItem() for _ in request.items])


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
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    print(port, flush=True)
    await server.wait_for_termination()


async def measure(kind: str, address: str, server: ServerCPU, args) -> str:
    request = pb.StepRequest(
        items=[pb.StepItem(session_id="s-0", step_index=1, response="<answer>Left</answer>")]
    )
    count, stop = [0], asyncio.Event()

    async def client() -> None:
        async with grpc.aio.insecure_channel(address) as channel:
            if kind == "unary":
                stub = pb_grpc.VisenvStub(channel)
                while not stop.is_set():
                    await stub.Step(request)
                    count[0] += 1
                return
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

    tasks = [asyncio.create_task(client()) for _ in range(args.clients)]
    await asyncio.sleep(args.warmup_s)
    n0, s0, c0, t0 = count[0], server.seconds(), client_cpu(), time.perf_counter()
    await asyncio.sleep(args.seconds)
    n = count[0] - n0
    rate = n / (time.perf_counter() - t0)
    server_us = (server.seconds() - s0) / n * 1e6
    client_us = (client_cpu() - c0) / n * 1e6
    stop.set()
    await asyncio.gather(*tasks)
    label = "unary call" if kind == "unary" else "stream message"
    return f"{label:15} {rate:8,.0f} calls/s   server {server_us:5.0f} us/call   clients {client_us:5.0f} us/call"


async def run(args) -> None:
    proc = subprocess.Popen(
        [sys.executable, __file__, "--serve"], stdout=subprocess.PIPE, text=True
    )
    try:
        address = f"127.0.0.1:{int(proc.stdout.readline())}"
        server = ServerCPU(proc.pid)
        for _ in range(args.rounds):
            for kind in ("unary", "stream"):
                print(await measure(kind, address, server, args), flush=True)
    finally:
        proc.kill()
        proc.wait()


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--clients", type=int, default=64)
    parser.add_argument("--seconds", type=float, default=8.0)
    parser.add_argument("--warmup-s", type=float, default=2.0)
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--serve", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    asyncio.run(serve() if args.serve else run(args))


if __name__ == "__main__":
    main()
