"""Per-session traffic: N concurrent clients, each stepping its own session.

How most training stacks call us (one agent loop per episode): the reference workload of
../shared/BENCHMARKS.md (Sokoban 6x6, 1 box, 16 px, PNG, grounding_worldmodeling, 2
random moves a turn, finished sessions reset), but each of 64 (and 256) clients owns one
session and sends single-session steps as fast as its replies come back, unsynchronised.
Beside them, in the same run against the same server: the batch-64 figures (gRPC and
REST, bench_transport's `measure`) and the in-process ceiling.

Per-session variants: gRPC (a step of one session per call: the SDK sends it on its `Calls`
stream, many calls on one stream), gRPC unary (the same with `grpc_stream=False`: a unary
call per step, as before the stream, or through a proxy without streams), REST (the single-session
endpoint POST /v1/sessions/{id}/step), and the OpenEnv WebSocket (/compat/openenv/sokoban/ws)
when the server has it. Each client has its own connection (its own AsyncEnvClient), as
separate agent loops would. Reported: env-steps/s (median of trials, min-max), p50/p99 of
one step (per-session) or of one batched call (batch), server and client CPU seconds per
1,000 env-steps.

With --compare, a second server with coalescing off (VISENV_COALESCE_MAX_ITEMS=1) runs
the per-session variants at 64 clients too: the before/after of coalescing, side by side.

    python bench/bench_sessions.py                 # 64 and 256 clients, ~4 minutes
    python bench/bench_sessions.py --quick         # a smoke run
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import os
import random
import statistics
import sys
import time
from pathlib import Path

import httpx
import psutil
from rich.console import Console

sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_transport import (  # noqa: E402
    CONFIG,
    Result,
    ServerCPU,
    bench_in_process,
    bench_remote,
    client_cpu,
    response,
    start_server,
    table,
)
from single_session import SingleSessionRest  # noqa: E402  (this folder)

from clients import AsyncEnvClient, SessionOptions  # noqa: E402

per_message: dict[int, float] = {}  # id(Result) -> requests per worker message


def options(seed: int) -> SessionOptions:
    return SessionOptions(
        "sokoban", config=CONFIG, seed=seed, format="grounding_worldmodeling", image_encoding="png"
    )


class OpenEnvWs:
    """One client of the OpenEnv WebSocket (/compat/openenv/{env}/ws; protocol in
    env_server/api/compat/openenv.py): reset (same options each time: same session), steps."""

    OPTIONS = {"config": CONFIG, "format": "grounding_worldmodeling"}

    def __init__(self, url: str) -> None:
        self.url = url
        self.ws = None

    async def open(self, seed: int) -> None:
        import websockets

        self.ws = await websockets.connect(self.url, max_size=None)
        await self.reset(seed)

    async def _call(self, kind: str, data: dict) -> dict:
        assert self.ws is not None
        await self.ws.send(json.dumps({"type": kind, "data": data}))
        reply = json.loads(await self.ws.recv())
        if reply.get("type") == "error":
            raise RuntimeError(f"OpenEnv WebSocket error: {reply}")
        return reply["data"]

    async def step(self, text: str) -> bool:
        return bool((await self._call("step", {"response": text}))["done"])

    async def reset(self, seed: int) -> None:
        await self._call("reset", {**self.OPTIONS, "seed": seed})

    async def close(self) -> None:
        if self.ws is not None:
            await self.ws.send(json.dumps({"type": "close"}))
            await self.ws.close()


def coalescing(http: str) -> tuple[int, int]:
    """Requests the server sent its workers, and the messages that carried them."""
    workers = httpx.get(f"http://{http}/health", timeout=30).json()["workers"]
    return sum(w.get("requests", 0) for w in workers), sum(w.get("messages", 0) for w in workers)


async def per_session(
    kind: str, n: int, address: str, args: argparse.Namespace, server: ServerCPU, http: str
) -> Result:
    """`n` clients, each stepping its own session (single-session calls) until told to stop;
    trials are time windows; a step counts in the window its reply arrived in."""
    records: list[tuple[float, float]] = []  # (reply time, latency)
    stop = asyncio.Event()

    async def grpc_or_rest(i: int, ready: asyncio.Event) -> None:
        rng = random.Random(i)
        seed = i
        transport = "grpc" if kind.startswith("grpc") else "http"
        async with AsyncEnvClient(
            address, transport=transport, timeout=300, grpc_stream=kind != "grpc-unary"
        ) as client:
            single = SingleSessionRest(client) if kind == "rest" else None
            (reply,) = await client.create([options(seed)])
            sid = reply.session_id
            ready.set()
            while not stop.is_set():
                t0 = time.perf_counter()
                if single is None:
                    (out,) = await client.step([sid], [response(rng)])
                else:
                    (out,) = await single.step([sid], [response(rng)])
                t1 = time.perf_counter()
                records.append((t1, t1 - t0))
                if out.done:
                    seed += n
                    if single is not None:
                        single.forget(sid)
                    await client.reset([sid], [seed])
            if single is not None:
                await single.aclose()

    async def websocket(i: int, ready: asyncio.Event) -> None:
        rng = random.Random(i)
        seed = i
        ws = OpenEnvWs(f"ws://{address}/compat/openenv/sokoban/ws")
        await ws.open(seed)
        ready.set()
        try:
            while not stop.is_set():
                t0 = time.perf_counter()
                done = await ws.step(response(rng))
                t1 = time.perf_counter()
                records.append((t1, t1 - t0))
                if done:
                    seed += n
                    await ws.reset(seed)
        finally:
            await ws.close()

    body = websocket if kind == "ws" else grpc_or_rest
    readies = [asyncio.Event() for _ in range(n)]
    tasks = [asyncio.create_task(body(i, readies[i])) for i in range(n)]
    await asyncio.wait_for(asyncio.gather(*(r.wait() for r in readies)), 300)
    await asyncio.sleep(args.warmup_s)
    rates, latencies = [], []
    r0, m0 = coalescing(http)
    (a0, w0), c0 = server.split(), client_cpu()
    counted = 0
    for _ in range(args.trials):
        t0 = time.perf_counter()
        await asyncio.sleep(args.trial_s)
        t1 = time.perf_counter()
        window = [lat for t, lat in records if t0 <= t < t1]
        rates.append(len(window) / (t1 - t0))
        latencies += window
        counted += len(window)
    (a1, w1), c1 = server.split(), client_cpu()
    r1, m1 = coalescing(http)
    stop.set()
    await asyncio.gather(*tasks)
    label = {"grpc": "gRPC", "grpc-unary": "gRPC unary", "rest": "REST", "ws": "OpenEnv WS"}[kind]
    result = Result(
        f"{label} per-session",
        n,
        rates,
        latencies,
        (a1 - a0 + w1 - w0) / max(counted, 1) * 1000,
        (c1 - c0) / max(counted, 1) * 1000,
        0,
        (a1 - a0) / max(counted, 1) * 1000,
    )
    per_message[id(result)] = (r1 - r0) / max(m1 - m0, 1)
    return result


async def has_openenv_ws(http: str) -> bool:
    try:
        import websockets
    except ImportError:
        return False
    try:
        async with websockets.connect(f"ws://{http}/compat/openenv/sokoban/ws", open_timeout=5):
            return True
    except Exception:  # noqa: BLE001  (no such route, or no WebSocket support)
        return False


async def run(args: argparse.Namespace) -> None:
    console = Console(width=170)
    gc.freeze()  # the client's own start-up objects: out of every later collection
    results: list[Result] = []

    def show(r: Result) -> None:
        results.append(r)
        console.print(f"{r.name:34} {r.batch:4}: {statistics.median(r.rates):8,.0f} env-steps/s  "
                      f"p50 {r.p50_ms:7.2f} ms  p99 {r.p99_ms:7.2f} ms  "
                      f"server CPU {r.server_cpu:.2f} s/1k  "
                      f"{per_message.get(id(r), 0):.1f} requests per worker message")  # fmt: skip

    show(await bench_in_process(64, "png", args))
    served = start_server(args.workers)
    http, grpc_address = served.http, served.grpc
    server = ServerCPU(served.proc.pid)
    ws = await has_openenv_ws(http)
    try:
        for kind in ("grpc-batch", "rest-batch"):
            address = grpc_address if kind.startswith("grpc") else http
            show(await bench_remote(kind, 64, "png", address, args, server))
        for n in args.clients:
            for kind in ("grpc", "grpc-unary", "rest", *(("ws",) if ws else ())):
                address = grpc_address if kind.startswith("grpc") else http
                show(await per_session(kind, n, address, args, server, http))
    finally:
        served.stop()
    if args.compare:
        os.environ["VISENV_COALESCE_MAX_ITEMS"] = "1"
        served = start_server(args.workers)
        http, grpc_address = served.http, served.grpc
        del os.environ["VISENV_COALESCE_MAX_ITEMS"]
        server = ServerCPU(served.proc.pid)
        try:
            r = await bench_remote("grpc-batch", 64, "png", grpc_address, args, server)
            r.name += " (no coalescing)"
            show(r)
            for kind in ("grpc", "rest"):
                r = await per_session(kind, args.clients[0], grpc_address if kind == "grpc"
                                      else http, args, server, http)  # fmt: skip
                r.name += " (no coalescing)"
                show(r)
        finally:
            served.stop()
    console.print(table(results, f"Per-session traffic vs batches, {args.workers} worker(s), "
                                 "loopback, one run"))  # fmt: skip
    by = {(r.name, r.batch): statistics.median(r.rates) for r in results}
    batch = by[("gRPC batch (png)", 64)]
    inproc = by[("in-process (png)", 64)]
    g64 = by.get(("gRPC per-session", 64))
    unary = by.get(("gRPC unary per-session", 64))
    # issue 44's targets: per-session >= 0.8x batch-64, and <= 0.35 s of server CPU per
    # 1,000 env-steps on every per-session transport (bench_transport has the third)
    line = f"gRPC batch-64 {batch:,.0f}/s = {batch / inproc:.2f}x in-process"
    if g64:
        line += (
            f"; gRPC per-session x64 {g64:,.0f}/s = {g64 / batch:.2f}x batch-64 (target >= 0.8x)"
        )
    if unary:
        line += f"; unary calls {unary:,.0f}/s = {unary / batch:.2f}x"
    cpu = [f"{r.name.removesuffix(' per-session')} {r.server_cpu:.2f}" for r in results
           if r.name.endswith("per-session") and r.batch == args.clients[0]]  # fmt: skip
    if cpu:
        line += f"; per-session server CPU s/1k: {', '.join(cpu)} (target <= 0.35)"
    console.print(line)
    if not ws:
        console.print("OpenEnv WebSocket: /compat/openenv/sokoban/ws not served here (skipped)")
    console.print(f"machine: {psutil.cpu_count()} cores, load average "
                  f"{', '.join(f'{x:.1f}' for x in os.getloadavg())}")  # fmt: skip
    if args.json:
        Path(args.json).write_text(json.dumps(
            [r.__dict__ | {"p50_ms": r.p50_ms, "p99_ms": r.p99_ms} for r in results], indent=1))  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--clients", type=int, nargs="+", default=[64, 256])
    parser.add_argument("--warmup", type=int, default=30, help="batch: warm-up steps")
    parser.add_argument("--steps", type=int, default=30, help="batch: steps per trial")
    parser.add_argument("--trials", type=int, default=3)
    parser.add_argument("--warmup-s", type=float, default=3.0, help="per-session warm-up")
    parser.add_argument("--trial-s", type=float, default=4.0, help="per-session trial length")
    parser.add_argument("--workers", type=int, default=psutil.cpu_count() or 1)
    parser.add_argument("--compare", action="store_true",
                        help="also a server with coalescing off (64 clients)")  # fmt: skip
    parser.add_argument("--quick", action="store_true", help="short trials, 64 clients only")
    parser.add_argument("--json", help="also write the results here")
    args = parser.parse_args()
    if args.quick:
        args.warmup, args.steps, args.trials = 5, 10, 1
        args.warmup_s, args.trial_s, args.clients = 1.0, 2.0, [64]
    asyncio.run(run(args))


if __name__ == "__main__":
    main()
