"""Heavy environments under concurrency: navigation, primitive_skill and svg on one server
with 2 workers, 16 concurrent sessions each (one client per session, single-session gRPC
steps, all at once), one environment at a time.

Prints: server start-up (the workers pre-warm the heavy envs before they say ready) and
what each worker's pre-warming took; per env, create latency (p50/max, and whether any
create still paid a warm-up: info.warm_up_s), then env-steps/s and per-step latency
p50/p99 over --steps steps per session (after one warm-up step), resetting finished
episodes, and server CPU seconds per step.

    python bench/bench_heavy.py                      # 16 sessions per env, 2 workers
    python bench/bench_heavy.py --envs svg --sessions 4 --steps 3
"""

from __future__ import annotations

import argparse
import asyncio
import random
import signal
import statistics
import subprocess
import sys
import time
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from bench_transport import ServerCPU  # noqa: E402

from clients import AsyncEnvClient, SessionOptions  # noqa: E402
from env_server.testing.launcher import launch_server  # noqa: E402

STEPS = {"navigation": 20, "primitive_skill": 4, "svg": 10}
NAV = ("moveahead", "rotateleft", "rotateright", "moveahead, moveahead", "lookdown, lookup")
SVG = ('<svg xmlns="http://www.w3.org/2000/svg" viewBox="0 0 72 72"><circle cx="36" cy="36" '
       'r="{r}" fill="#{c:06x}"/><rect x="10" y="{y}" width="30" height="12" fill="#333"/></svg>')  # fmt: skip


def answer(env: str, reply, rng: random.Random) -> str:
    if env == "navigation":
        act = rng.choice(NAV)
    elif env == "primitive_skill":  # pick an object where it is, place it a little aside
        objects = list(reply.observation.ground_truth.get("objects", {}).values()) or [[0, 0, 20]]
        x, y, z = rng.choice(objects)
        act = f"pick({x}, {y}, {z}), place({x}, {y + rng.choice((-40, 40))}, {z})"
    else:
        act = SVG.format(r=rng.randrange(10, 30), c=rng.randrange(2**24), y=rng.randrange(40, 60))
    return f"<think>bench</think><answer>{act}</answer>"


def percentile(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(round(q * (len(xs) - 1))))]


async def bench_env(env: str, args: argparse.Namespace, grpc: str, server: ServerCPU) -> dict:
    latencies: list[float] = []
    creates: list[float] = []
    paid: list[float] = []

    async def one(i: int) -> None:
        rng = random.Random(i)
        async with AsyncEnvClient(grpc, timeout=600) as client:
            t0 = time.perf_counter()
            (reply,) = await client.create([SessionOptions(env, seed=i, format="free_think")])
            creates.append(time.perf_counter() - t0)
            if "warm_up_s" in reply.info:
                paid.append(reply.info["warm_up_s"])
            sid = reply.session_id
            for n in range(args.steps.get(env, 5) + 1):
                t0 = time.perf_counter()
                (reply,) = await client.step([sid], [answer(env, reply, rng)])
                if n:  # the first step of each session is a warm-up
                    latencies.append(time.perf_counter() - t0)
                if reply.done:
                    (reply,) = await client.reset([sid], [rng.randrange(10**6)])
            await client.close([sid])

    s0 = server.seconds()
    t0 = time.perf_counter()
    await asyncio.gather(*(one(i) for i in range(args.sessions)))
    wall = time.perf_counter() - t0
    cpu = server.seconds() - s0
    steps = len(latencies)
    return {
        "env": env,
        "sessions": args.sessions,
        "create p50 s": statistics.median(creates),
        "create max s": max(creates),
        "creates paying warm-up": len(paid),
        "steps": steps,
        # every session's creates and warm-up steps are inside the wall time: a lower bound
        "env-steps/s": steps / wall,
        "p50 ms": statistics.median(latencies) * 1e3,
        "p99 ms": percentile(latencies, 0.99) * 1e3,
        "server CPU s/step": cpu / max(steps, 1),
    }


def start(args: argparse.Namespace) -> tuple[subprocess.Popen, str, str, float]:
    server = launch_server(workers=args.workers, envs=",".join(args.envs), timeout=900,
                           ready="banner", inherit_env=True)  # fmt: skip
    return server.proc, server.http, server.grpc, server.banner_s


async def run(args: argparse.Namespace) -> None:
    proc, http, grpc, started = start(args)
    try:
        health = httpx.get(f"http://{http}/health", timeout=60).json()
        print(f"server ready in {started:.1f} s; pre-warmed per worker:")
        for w in health["workers"]:
            print(f"  worker {w['index']}: {w.get('prewarmed')}")
        rows = []
        for env in args.envs:
            row = await bench_env(env, args, grpc, ServerCPU(proc.pid))
            rows.append(row)
            print("  ".join(f"{k} {v:.3g}" if isinstance(v, float) else f"{k} {v}"
                            for k, v in row.items()))  # fmt: skip
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
    print("\n| env | sessions | env-steps/s | p50 ms | p99 ms | server CPU s/step | create p50 s "
          "| creates paying warm-up |\n|---|---|---|---|---|---|---|---|")  # fmt: skip
    for r in rows:
        print(f"| {r['env']} | {r['sessions']} | {r['env-steps/s']:.1f} | {r['p50 ms']:.0f} | "
              f"{r['p99 ms']:.0f} | {r['server CPU s/step']:.3f} | {r['create p50 s']:.2f} | "
              f"{r['creates paying warm-up']} |")  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--envs", nargs="+", default=["navigation", "primitive_skill", "svg"])
    parser.add_argument("--sessions", type=int, default=16)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--steps", type=int, default=None,
                        help=f"steps per session (default per env: {STEPS})")  # fmt: skip
    args = parser.parse_args()
    args.steps = {e: args.steps for e in args.envs} if args.steps else STEPS
    asyncio.run(run(args))


if __name__ == "__main__":
    main()
