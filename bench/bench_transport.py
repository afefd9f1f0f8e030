"""Transport benchmark: the reference workload of ../shared/BENCHMARKS.md.

Sokoban 6x6, 1 box, 16 px tiles, 64 sessions each reset with its own seed, format
grounding_worldmodeling; every step sends each session a well-formed response whose
answer holds 2 random moves; finished sessions are reset (inside the measured time).
30 warm-up steps, then `--trials` trials of 30 batched steps.

Variants, measured side by side in one run against one `visenv serve` process:
in-process (the worker's own step code, images encoded: the ceiling), REST one-by-one
(64 concurrent single-session requests), REST batch, gRPC batch; PNG and raw images;
batch of 64 and batch of 1. For each: env-steps/s (median of trials, min-max), p50/p99
latency of one batched call, CPU seconds of server (API process + workers) and client
per 1,000 env-steps, and bytes per env-step on the wire (request + reply).

    python bench/bench_transport.py                # starts its own server
    python bench/bench_transport.py --quick        # fewer steps, for a smoke run
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import random
import statistics
import sys
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path

import psutil
from rich.console import Console
from rich.table import Table

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from single_session import SingleSessionRest  # noqa: E402  (this folder)

from clients import AsyncEnvClient, SessionOptions  # noqa: E402
from clients.transport import GrpcTransport, HttpTransport, StepItem  # noqa: E402
from env_server.testing.launcher import VisenvServer, launch_server  # noqa: E402
from visenv.v1 import visenv_pb2 as pb  # noqa: E402

MOVES = ("Up", "Down", "Left", "Right")
GRID = "######\n#_P__#\n#_X__#\n#__O_#\n#____#\n######"
CONFIG = {"dim_room": [6, 6], "num_boxes": 1, "tile_size": 16}


def response(rng: random.Random) -> str:
    moves = ", ".join(rng.choice(MOVES) for _ in range(2))
    return (
        f"<think><observation>{GRID}</observation><reasoning>The box is below me; "
        f"I move around it.</reasoning><prediction>{GRID}</prediction></think>"
        f"<answer>{moves}</answer>"
    )


@dataclass
class Result:
    name: str
    batch: int
    rates: list[float]  # env-steps/s per trial
    latencies: list[float]  # seconds per batched step call
    server_cpu: float  # seconds per 1,000 env-steps
    client_cpu: float
    bytes_per_step: float
    api_cpu: float = 0.0  # of server_cpu: the API process's (the rest is the workers')

    @property
    def p50_ms(self) -> float:
        return statistics.median(self.latencies) * 1e3

    @property
    def p99_ms(self) -> float:
        xs = sorted(self.latencies)
        return xs[min(len(xs) - 1, int(round(0.99 * (len(xs) - 1))))] * 1e3


class ServerCPU:
    """CPU seconds of a process and all its descendants (workers, forkserver)."""

    def __init__(self, pid: int | None) -> None:
        self.proc = psutil.Process(pid) if pid else None

    def seconds(self) -> float:
        return sum(self.split())

    def split(self) -> tuple[float, float]:
        """CPU seconds of the API process itself, and of its descendants (the workers)."""
        if self.proc is None:
            return 0.0, 0.0
        api = workers = 0.0
        for p in [self.proc, *self.proc.children(recursive=True)]:
            try:
                t = p.cpu_times()
            except psutil.NoSuchProcess:
                continue
            if p.pid == self.proc.pid:
                api += t.user + t.system
            else:
                workers += t.user + t.system
        return api, workers


def client_cpu() -> float:
    t = psutil.Process().cpu_times()
    return t.user + t.system


async def measure(
    name: str,
    batch: int,
    step: Callable[[list[str]], Awaitable[list[bool]]],
    reset: Callable[[list[int]], Awaitable[None]],
    args: argparse.Namespace,
    server: ServerCPU,
    bytes_per_step: float,
) -> Result:
    """Warm up, then trials of batched steps; `step` answers done flags, `reset` restarts
    the finished sessions (by position); both inside the timed loop."""
    rng = random.Random(0)

    async def one() -> float:
        t0 = time.perf_counter()
        done = await step([response(rng) for _ in range(batch)])
        elapsed = time.perf_counter() - t0
        finished = [i for i, d in enumerate(done) if d]
        if finished:
            await reset(finished)
        return elapsed

    for _ in range(args.warmup):
        await one()
    rates, latencies = [], []
    (a0, w0), c0 = server.split(), client_cpu()
    for _ in range(args.trials):
        t0 = time.perf_counter()
        for _ in range(args.steps):
            latencies.append(await one())
        rates.append(batch * args.steps / (time.perf_counter() - t0))
    steps = batch * args.steps * args.trials
    a1, w1 = server.split()
    return Result(
        name,
        batch,
        rates,
        latencies,
        (a1 - a0 + w1 - w0) / steps * 1000,
        (client_cpu() - c0) / steps * 1000,
        bytes_per_step,
        (a1 - a0) / steps * 1000,
    )


# ---- in-process ----------------------------------------------------------------------


async def bench_in_process(batch: int, encoding: str, args: argparse.Namespace) -> Result:
    from env_server.reasoning import ReasoningConfig
    from env_server.service.messages import Create, Reset, Step
    from env_server.service.models import SessionOptions
    from env_server.service.worker import Worker

    worker = Worker()
    worker.preload(["sokoban"])
    gc.freeze()  # as a worker process does after start-up: imports out of every collection
    ids = [f"s-{i:016x}" for i in range(batch)]
    options = {
        "env": "sokoban",
        "config": CONFIG,
        "format": "grounding_worldmodeling",
        "image_encoding": encoding,
    }
    made = [SessionOptions.model_validate({**options, "seed": i}) for i in range(batch)]
    worker.handle([Create(sid, o, ReasoningConfig()) for sid, o in zip(ids, made, strict=True)])
    seeds = list(range(batch))

    async def step(texts: list[str]) -> list[bool]:
        stepped = worker.handle([Step(sid, t) for sid, t in zip(ids, texts, strict=True)])
        return [s.reply.terminated or s.reply.truncated for s in stepped]

    async def reset(positions: list[int]) -> None:
        for p in positions:
            seeds[p] += batch
        worker.handle([Reset(ids[p], seeds[p]) for p in positions])

    return await measure(f"in-process ({encoding})", batch, step, reset, args, ServerCPU(None), 0)


# ---- over the wire ----------------------------------------------------------------------


async def bench_remote(
    kind: str, batch: int, encoding: str, address: str, args: argparse.Namespace, server: ServerCPU
) -> Result:
    """kind: 'rest-batch', 'rest-single' (one request per session) or 'grpc-batch'."""
    transport = "grpc" if kind.startswith("grpc") else "http"
    async with AsyncEnvClient(address, transport=transport, timeout=120) as client:
        replies = await client.create(
            [
                SessionOptions(
                    "sokoban",
                    config=CONFIG,
                    seed=i,
                    format="grounding_worldmodeling",
                    image_encoding=encoding,
                )
                for i in range(batch)
            ]
        )
        ids = [r.session_id for r in replies]
        seeds = list(range(batch))

        single = SingleSessionRest(client) if kind == "rest-single" else None

        async def step(texts: list[str]) -> list[bool]:
            if single is not None:
                out = await single.step(ids, texts)
            else:
                out = await client.step(ids, texts)
            return [r.done for r in out]

        async def reset(positions: list[int]) -> None:
            for p in positions:
                seeds[p] += batch
                if single is not None:
                    single.forget(ids[p])
            await client.reset([ids[p] for p in positions], [seeds[p] for p in positions])

        wire = await bytes_per_env_step(kind, client, ids, encoding)
        label = {
            "rest-batch": "REST batch",
            "rest-single": "REST one-by-one",
            "grpc-batch": "gRPC batch",
        }[kind]
        result = await measure(f"{label} ({encoding})", batch, step, reset, args, server, wire)
        if single is not None:
            await single.aclose()
        return result


async def bytes_per_env_step(
    kind: str, client: AsyncEnvClient, ids: list[str], encoding: str
) -> float:
    """Request + reply bytes of one batched step, per session (measured once, untimed)."""
    transport = client._router.servers[0].transport  # noqa: SLF001  (the benchmark looks under the hood)
    transport = getattr(transport, "inner", transport)  # under the limits' splitter
    rng = random.Random(1)
    items = [StepItem(sid, client.next_step_index(sid), response=response(rng)) for sid in ids]
    if isinstance(transport, GrpcTransport):
        req = pb.StepRequest()
        for it in items:
            req.items.add(session_id=it.session_id, step_index=it.step_index, response=it.response)
        resp = await transport.rpc.stub.Step(req, timeout=60)
        total = req.ByteSize() + resp.ByteSize()
    else:
        assert isinstance(transport, HttpTransport)
        if kind == "rest-single":
            total = 0
            for it in items:
                body = json.dumps({"step_index": it.step_index, "response": it.response})
                r = await transport._http.post(f"/v1/sessions/{it.session_id}/step", content=body,  # noqa: SLF001
                                               headers={"content-type": "application/json"})  # fmt: skip
                total += len(body) + len(r.content)
        else:
            body = json.dumps({"items": [{"session_id": it.session_id, "step_index": it.step_index,
                                          "response": it.response} for it in items]})  # fmt: skip
            r = await transport._http.post("/v1/batch/step", content=body,  # noqa: SLF001
                                           headers={"content-type": "application/json"})  # fmt: skip
            total = len(body) + len(r.content)
    # the client's step_index bookkeeping must follow the step sent by hand
    await client.get(ids)
    for sid in ids:
        client._next_step[sid] += 1  # noqa: SLF001
    return total / len(ids)


def start_server(workers: int) -> VisenvServer:
    """`visenv serve` (sokoban only) as started for the benches, once its banner is out:
    `.proc`, `.http` (no scheme), `.grpc`, and `.stop()`."""
    return launch_server(workers=workers, envs="sokoban", timeout=180, ready="banner",
                         inherit_env=True)  # fmt: skip


def table(results: list[Result], title: str) -> Table:
    t = Table(title=title)
    for col in (
        "variant",
        "batch",
        "env-steps/s",
        "(min-max)",
        "p50 ms",
        "p99 ms",
        "server CPU s/1k",
        "(API+workers)",
        "client CPU s/1k",
        "bytes/step",
    ):
        t.add_column(col, justify="left" if col == "variant" else "right")
    for r in results:
        t.add_row(
            r.name,
            str(r.batch),
            f"{statistics.median(r.rates):,.0f}",
            f"{min(r.rates):,.0f}-{max(r.rates):,.0f}",
            f"{r.p50_ms:.2f}",
            f"{r.p99_ms:.2f}",
            f"{r.server_cpu:.2f}",
            f"{r.api_cpu:.2f}+{r.server_cpu - r.api_cpu:.2f}" if r.server_cpu else "-",
            f"{r.client_cpu:.2f}",
            f"{r.bytes_per_step:,.0f}" if r.bytes_per_step else "-",
        )
    return t


async def run(args: argparse.Namespace) -> None:
    console = Console(width=160)
    served = start_server(args.workers)
    http, grpc_address = served.http, served.grpc
    # the client's start-up heap out of every later collection, as the server does with
    # its own: unfrozen, this process's full collections (17-21 ms, about one a second at
    # batch 64; bench/tail_latency.py) were the p99 of every variant, not the server
    gc.freeze()
    server = ServerCPU(served.proc.pid)
    results: list[Result] = []
    try:
        n = args.sessions
        plan: list[tuple[str, int, str]] = [
            ("in-process", n, "png"),
            ("in-process", n, "raw"),
            ("rest-single", n, "png"),
            ("rest-batch", n, "png"),
            ("rest-batch", n, "raw"),
            ("grpc-batch", n, "png"),
            ("grpc-batch", n, "raw"),
            ("in-process", 1, "png"),
            ("rest-batch", 1, "png"),
            ("grpc-batch", 1, "png"),
        ]
        for kind, batch, encoding in plan:
            if kind == "in-process":
                r = await bench_in_process(batch, encoding, args)
            else:
                address = grpc_address if kind.startswith("grpc") else http
                r = await bench_remote(kind, batch, encoding, address, args, server)
            results.append(r)
            console.print(f"{r.name:24} batch {batch:3}: {statistics.median(r.rates):8,.0f} env-steps/s  "
                          f"p50 {r.p50_ms:7.2f} ms  p99 {r.p99_ms:7.2f} ms")  # fmt: skip
    finally:
        served.stop()
    console.print(
        table(
            results, f"Sokoban reference workload, server with {args.workers} worker(s), loopback"
        )
    )
    by = {(r.name, r.batch): r for r in results}
    ceiling = statistics.median(by[("in-process (png)", args.sessions)].rates)
    grpc64 = statistics.median(by[("gRPC batch (png)", args.sessions)].rates)
    one = by[("gRPC batch (png)", 1)]
    # CPU per env-step: the served path's (API process and workers) over the in-process
    # step's own (the ceiling's client CPU is the step itself)
    cpu_ratio = (
        by[("gRPC batch (png)", args.sessions)].server_cpu
        / by[("in-process (png)", args.sessions)].client_cpu
    )
    console.print(
        f"gRPC batch-{args.sessions} PNG: served CPU per env-step {cpu_ratio:.2f}x the "
        f"in-process step's (target <= 1.25x); {grpc64:,.0f} env-steps/s (target >= 1,500), "
        f"{grpc64 / ceiling:.2f}x in-process; "
        f"gRPC batch-1: p50 {one.p50_ms:.2f} ms (target <= 1 ms), p99/p50 {one.p99_ms / one.p50_ms:.2f} (target <= 2)"
    )
    if args.json:
        Path(args.json).write_text(
            json.dumps(
                [r.__dict__ | {"p50_ms": r.p50_ms, "p99_ms": r.p99_ms} for r in results], indent=1
            )
        )


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--sessions", type=int, default=64)
    parser.add_argument("--warmup", type=int, default=30)
    parser.add_argument("--steps", type=int, default=30, help="batched steps per trial")
    parser.add_argument("--trials", type=int, default=3)
    parser.add_argument(
        "--workers", type=int, default=psutil.cpu_count() or 1, help="server worker processes"
    )
    parser.add_argument("--quick", action="store_true", help="5 warm-up steps, 1 trial of 10")
    parser.add_argument("--json", help="also write the results here")
    args = parser.parse_args()
    if args.quick:
        args.warmup, args.steps, args.trials = 5, 10, 1
    asyncio.run(run(args))


if __name__ == "__main__":
    main()
