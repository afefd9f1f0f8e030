"""The worker pipe and the server's CPU split, on the reference workload
(../shared/BENCHMARKS.md: 64 Sokoban sessions, PNG, grounding_worldmodeling).

Per message (default): CPU microseconds to pickle (`pipe.envelope`) and unpickle
(`pipe.opened`) each kind of message and answer that crosses a worker pipe, in a batch of
64 and alone, best of 7 passes (process time), with its size. The answers are the ones
this checkout's `Worker` makes for the workload.

    python bench/bench_pipe.py

Split (`--split CHECKOUT ...`): `visenv serve --workers 2` of each checkout in turn (the
rounds alternate them), stepped over gRPC in batches of 64 (finished sessions reset, as
bench_transport does); CPU microseconds per env-step of the API process and of the
workers (with everything they start), from the processes' own CPU times.

    python bench/bench_pipe.py --split ../today . --rounds 3

Phases (`--phases CHECKOUT ...`): the API process's work by phase, in each checkout's own
process (the rounds alternate them): an `EnvService` with 2 real workers and the gRPC
servicer's `Step` and `Reset` called directly on parsed requests (no network), each phase
wrapped in a process-time timer (about 1 us of its own per call); CPU us per env-step.

    python bench/bench_pipe.py --phases ../main . --rounds 2
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
    from env_server.service.pipe import envelope, opened
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


# the API process's phases (`--phases`): (module, attribute, label)
PHASES = [
    ("env_server.service.worker_handle", "opened", "unpickling the answers"),
    ("env_server.service.worker_handle", "envelope", "pickling the messages"),
    ("env_server.service.rewards", "Rewards.penalty", "the reasoning guard"),
    ("env_server.service.rewards", "assemble_reward", "reward assembly"),
    ("env_server.service.service", "writable", "writable"),
    ("visenv.wire", "batch_to_proto", "replies to protobuf"),
    ("env_server.api.grpc_server", "step_item", "request items (step_item)"),
]
# where a phase's module was in the checkouts before it moved
MOVED = {"env_server.service.worker_handle": "env_server.service.pool"}


def phases_once(warmup: int, steps: int) -> None:
    """In the checkout's own process: print `label=us` per phase, `gc=us`, `all=us`."""
    import collections
    import functools
    import gc
    import importlib
    import importlib.util
    import json

    root = Path.cwd()
    sys.path.insert(0, str(root))
    sys.path.insert(0, str(root / "bench"))
    import bench_transport as bt

    spent: collections.Counter[str] = collections.Counter()

    def wrap(owner, name: str, label: str) -> None:
        f = getattr(owner, name)

        @functools.wraps(f)
        def timed(*args, **kwargs):
            t = time.process_time()
            try:
                return f(*args, **kwargs)
            finally:
                spent[label] += time.process_time() - t

        setattr(owner, name, timed)

    for module, attr, label in PHASES:
        if module in MOVED and importlib.util.find_spec(module) is None:
            module = MOVED[module]  # a checkout from before the move
        owner = importlib.import_module(module)
        *path, name = attr.split(".")
        for part in path:
            owner = getattr(owner, part)
        wrap(owner, name, label)

    from env_server.api.grpc_server import VisenvServicer
    from env_server.service.service import EnvService
    from env_server.service.settings import Settings
    from visenv.v1 import visenv_pb2 as pb

    class Context:
        async def abort(self, *args, **kwargs):
            raise RuntimeError(args)

    async def drive() -> None:
        async with EnvService(Settings(workers=2, envs=["sokoban"])) as service:
            servicer, ctx = VisenvServicer(service), Context()
            created = await servicer.Create(pb.CreateRequest(items=[
                pb.SessionOptions(env="sokoban", config_json=json.dumps(bt.CONFIG), seed=i,
                                  format="grounding_worldmodeling") for i in range(N)
            ]), ctx)  # fmt: skip
            ids = [r.reply.session_id for r in created.results]
            index, seeds, rng = [0] * N, list(range(N)), random.Random(0)

            async def one() -> float:
                request = pb.StepRequest(items=[
                    pb.StepItem(session_id=s, step_index=index[i], response=bt.response(rng))
                    for i, s in enumerate(ids)
                ]).SerializeToString()  # fmt: skip
                t = time.process_time()
                reply = await servicer.Step(pb.StepRequest.FromString(request), ctx)
                reply.SerializeToString()
                took = time.process_time() - t
                done = []
                for i, r in enumerate(reply.results):
                    index[i] = r.reply.step_index
                    if r.reply.terminated or r.reply.truncated:
                        done.append(i)
                if done:
                    for i in done:
                        seeds[i] += N
                        index[i] = 0
                    request = pb.ResetRequest(items=[
                        pb.ResetItem(session_id=ids[i], seed=seeds[i]) for i in done
                    ]).SerializeToString()  # fmt: skip
                    t = time.process_time()
                    reply = await servicer.Reset(pb.ResetRequest.FromString(request), ctx)
                    reply.SerializeToString()
                    took += time.process_time() - t
                return took

            for _ in range(warmup):
                await one()
            spent.clear()
            collected, started = [0.0], [0.0]

            def on_gc(phase: str, info: dict) -> None:
                if phase == "start":
                    started[0] = time.process_time()
                else:
                    collected[0] += time.process_time() - started[0]

            gc.callbacks.append(on_gc)
            total = sum([await one() for _ in range(steps)])
            gc.callbacks.remove(on_gc)
            k = steps * N
            fields = [f"{label.replace(' ', '_')}={spent[label] / k * 1e6:.2f}"
                      for _, _, label in PHASES]  # fmt: skip
            print(" ".join([*fields, f"gc={collected[0] / k * 1e6:.2f}",
                            f"all={total / k * 1e6:.2f}"]))  # fmt: skip

    asyncio.run(drive())


def _alternate(
    checkouts: list[Path], rounds: int, flag: str, warmup: int, steps: int
) -> dict[Path, list[dict[str, float]]]:
    """Run this script with `flag` (`--phases-once` or `--split-once`) in each checkout in
    turn, round after round; each run's last line of `name=value` fields, per checkout."""
    runs: dict[Path, list[dict[str, float]]] = {c: [] for c in checkouts}
    for n in range(rounds):
        for c in checkouts:
            out = subprocess.run(
                [sys.executable, str(Path(__file__).resolve()), flag, "--warmup",
                 str(warmup), "--steps", str(steps)],
                cwd=c, env={**os.environ, "PYTHONPATH": str(c)}, check=True,
                capture_output=True, text=True,
            ).stdout.strip().split("\n")[-1].split()  # fmt: skip
            runs[c].append({k: float(v) for k, v in (f.split("=") for f in out)})
            print(f"round {n + 1} {c.name}: " + ", ".join(f"{k} {v:,.1f}" for k, v in
                  runs[c][-1].items() if k in ("all", "api", "workers", "rate")), flush=True)  # fmt: skip
    return runs


def phases(checkouts: list[Path], rounds: int, warmup: int, steps: int) -> None:
    runs = _alternate(checkouts, rounds, "--phases-once", warmup, steps)
    names = list(runs[checkouts[0]][0])
    print("\n| phase | " + " | ".join(c.name for c in checkouts) + " |")
    print("|---|" + "---:|" * len(checkouts))
    for name in names:
        cells = [", ".join(f"{r[name]:.1f}" for r in runs[c]) for c in checkouts]
        print(f"| {name.replace('_', ' ')} | " + " | ".join(cells) + " |")
    print("\n(CPU us per env-step in the API process, each round's; all: the Step and Reset calls)")


def split(checkouts: list[Path], rounds: int, warmup: int, steps: int) -> None:
    runs = _alternate(checkouts, rounds, "--split-once", warmup, steps)
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
    parser.add_argument("--phases", type=Path, nargs="+", metavar="CHECKOUT")
    parser.add_argument("--split-once", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--phases-once", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.split_once:
        split_once(args.warmup, args.steps)
    elif args.phases_once:
        phases_once(args.warmup, args.steps)
    elif args.phases:
        phases([c.resolve() for c in args.phases], args.rounds, args.warmup, args.steps)
    elif args.split:
        split([c.resolve() for c in args.split], args.rounds, args.warmup, args.steps)
    else:
        per_message()


if __name__ == "__main__":
    main()
