"""The worker pipe and the server's CPU split, on the reference workload
(../shared/BENCHMARKS.md: 64 Sokoban sessions, PNG, grounding_worldmodeling).

Per message (default): CPU microseconds to pickle (`pool.envelope`) and unpickle
(`pool.opened`) each kind of message and answer that crosses a worker pipe, in a batch of
64 and alone, best of 7 passes (process time), with its size. The answers are the ones
this checkout's `Worker` makes for the workload.

    python bench/bench_pipe.py

Split (`--split CHECKOUT ...`): `visenv serve --workers 2` of each checkout in turn (the
rounds alternate them), stepped over gRPC in batches of 64 (finished sessions reset, as
bench_transport does); CPU microseconds per env-step of the API process and of the
workers (with everything they start), from the processes' own CPU times.

    python bench/bench_pipe.py --split ../today . --rounds 3
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import os
import random
import statistics
import subprocess
import sys
import time
from pathlib import Path

N = 64


def best(f, reps: int, rounds: int = 7) -> float:
    """Seconds of process time per call of `f`, the best of `rounds` passes."""
    out = []
    for _ in range(rounds):
        t = time.process_time()
        for _ in range(reps):
            f()
        out.append((time.process_time() - t) / reps)
    return min(out)


def per_message() -> None:
    sys.path.insert(0, str(Path.cwd() / "bench"))
    import gc

    import bench_transport as bt

    from env_server.reasoning import ReasoningConfig
    from env_server.service.messages import Create, Reset, Step
    from env_server.service.models import ActionModel, SessionOptions
    from env_server.service.pool import envelope, opened
    from env_server.service.worker import Worker

    worker = Worker()
    worker.preload(["sokoban"])
    ids = [f"s-{i:016x}" for i in range(N)]
    options = {"env": "sokoban", "config": bt.CONFIG, "format": "grounding_worldmodeling",
               "image_encoding": "png"}  # fmt: skip
    made = [SessionOptions.model_validate({**options, "seed": i}) for i in range(N)]
    # each session's own validated reasoning config, as the service sends them
    creates = [
        Create(s, o, ReasoningConfig.model_validate(o.reasoning))
        for s, o in zip(ids, made, strict=True)
    ]
    created = worker.handle(creates)
    rng = random.Random(0)
    steps = [Step(s, bt.response(rng)) for s in ids]
    stepped = worker.handle(steps)
    manual = [Step(s, actions=[ActionModel(name="Left"), ActionModel(name="Up")]) for s in ids]
    resets = [Reset(s, 100 + i) for i, s in enumerate(ids)]
    reset = worker.handle(resets)
    gc.freeze()  # as a worker process and the API process do after start-up
    print("| message | bytes | pickle x64 | unpickle x64 | pickle x1 | unpickle x1 |")
    print("|---|---:|---:|---:|---:|---:|")
    rows = [("Create", creates), ("Create's reply", created), ("Step (response)", steps),
            ("Stepped", stepped), ("Step (2 actions)", manual), ("Reset", resets),
            ("Reset's reply", reset)]  # fmt: skip
    for name, batch in rows:
        data, one = envelope(1, batch), envelope(1, batch[:1])
        cells = [
            best(functools.partial(envelope, 1, batch), 30) / N,
            best(functools.partial(opened, data), 30) / N,
            best(functools.partial(envelope, 1, batch[:1]), 500),
            best(functools.partial(opened, one), 500),
        ]
        print(f"| {name} | {len(data) / N:,.0f} | "
              + " | ".join(f"{c * 1e6:.2f}" for c in cells) + " |")  # fmt: skip
    print("\n(CPU us per message, best of 7 passes; bytes: per message in a batch of 64)")


def cpu(proc) -> float:
    t = proc.cpu_times()
    return t.user + t.system


def split_once(warmup: int, steps: int) -> None:
    """In the checkout's own process: serve, step, print `api=us workers=us rate=`."""
    root = Path.cwd()
    sys.path.insert(0, str(root))
    sys.path.insert(0, str(root / "bench"))
    import bench_transport as bt
    import psutil

    from clients import AsyncEnvClient, SessionOptions

    server = bt.start_server(2)
    proc, address = (
        (server.proc, server.grpc) if hasattr(server, "grpc") else (server[0], server[2])
    )

    async def drive() -> None:
        api = psutil.Process(proc.pid)
        async with AsyncEnvClient(address, transport="grpc", timeout=120) as client:
            options = [SessionOptions("sokoban", config=bt.CONFIG, seed=i,
                                      format="grounding_worldmodeling") for i in range(N)]  # fmt: skip
            ids = [r.session_id for r in await client.create(options)]
            seeds, rng = list(range(N)), random.Random(0)

            async def one() -> None:
                replies = await client.step(ids, [bt.response(rng) for _ in ids])
                done = [i for i, r in enumerate(replies) if r.done]
                for i in done:
                    seeds[i] += N
                if done:
                    await client.reset([ids[i] for i in done], [seeds[i] for i in done])

            for _ in range(warmup):
                await one()
            workers = api.children(recursive=True)
            a0, w0, t0 = cpu(api), sum(cpu(w) for w in workers), time.perf_counter()
            for _ in range(steps):
                await one()
            took = time.perf_counter() - t0
            a, w = cpu(api) - a0, sum(cpu(w) for w in workers) - w0
            k = steps * N
            print(f"api={a / k * 1e6:.1f} workers={w / k * 1e6:.1f} rate={k / took:.0f}")

    try:
        asyncio.run(drive())
    finally:
        if hasattr(server, "stop"):
            server.stop()
        else:  # the checkouts before the launcher: a process group
            import signal

            os.killpg(proc.pid, signal.SIGINT)
            proc.wait(30)


def split(checkouts: list[Path], rounds: int, warmup: int, steps: int) -> None:
    runs: dict[Path, list[dict[str, float]]] = {c: [] for c in checkouts}
    for n in range(rounds):
        for c in checkouts:
            out = subprocess.run(
                [sys.executable, str(Path(__file__).resolve()), "--split-once", "--warmup",
                 str(warmup), "--steps", str(steps)],
                cwd=c, env={**os.environ, "PYTHONPATH": str(c)}, check=True,
                capture_output=True, text=True,
            ).stdout.split()[-3:]  # fmt: skip
            row = {k: float(v) for k, v in (field.split("=") for field in out)}
            runs[c].append(row)
            print(f"round {n + 1} {c.name}: API {row['api']:.1f} us, workers "
                  f"{row['workers']:.1f} us per env-step, {row['rate']:,.0f} env-steps/s",
                  flush=True)  # fmt: skip
    print("\n| checkout | API process | workers | server | env-steps/s |")
    print("|---|---:|---:|---:|---:|")
    for c in checkouts:
        med = {k: statistics.median(r[k] for r in runs[c]) for k in ("api", "workers", "rate")}
        total = statistics.median(r["api"] + r["workers"] for r in runs[c])
        print(f"| {c.name} | {med['api']:.1f} | {med['workers']:.1f} | {total:.1f} | "
              f"{med['rate']:,.0f} |")  # fmt: skip
    print("\n(CPU us per env-step, medians of the rounds; server: API process + workers)")


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--split", type=Path, nargs="+", metavar="CHECKOUT")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--warmup", type=int, default=10, help="batched steps before measuring")
    parser.add_argument("--steps", type=int, default=60, help="batched steps measured per run")
    parser.add_argument("--split-once", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.split_once:
        split_once(args.warmup, args.steps)
    elif args.split:
        split([c.resolve() for c in args.split], args.rounds, args.warmup, args.steps)
    else:
        per_message()


if __name__ == "__main__":
    main()
