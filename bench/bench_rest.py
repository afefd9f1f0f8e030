"""REST benchmark on the reference workload of ../shared/BENCHMARKS.md.

Sokoban 6x6, 1 box, 16 px tiles (96x96 images), 64 sessions each reset with its own
seed, format grounding_worldmodeling; every step sends each session a well-formed
response whose answer holds 2 random moves; sessions that finish are reset (inside
the measured time). Warm-up 30 steps, then `--trials` trials of 30 batched steps.

Variants, side by side in one run against one `visenv serve` process (plain httpx, no SDK):

- in-process: the worker's own step code (parse, step, grade, encode) in this process,
  no server: the ceiling; also the share of its time spent encoding images
- REST batch of 64 (PNG, and raw images), REST batch of 1
- REST one-by-one: 64 single-session step calls per round, in a row and all concurrent

For each: env-steps/s (median of trials, min-max), p50/p99 latency of one call, CPU
seconds of server (API process + workers) and client per 1,000 env-steps, bytes per
env-step (request + reply bodies).

    python bench/bench_rest.py                 # starts its own server (2 workers)
    python bench/bench_rest.py --quick         # fewer steps: a smoke run
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import signal
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench_transport import ServerCPU, client_cpu  # noqa: E402  (same folder)

from env_server.reasoning import ReasoningConfig  # noqa: E402
from env_server.service import images as images_module  # noqa: E402
from env_server.service import worker as worker_module  # noqa: E402
from env_server.service.messages import Create, Reset, Step  # noqa: E402
from env_server.service.models import SessionOptions  # noqa: E402
from env_server.testing.launcher import launch_server  # noqa: E402

MOVES = ("Up", "Down", "Left", "Right")
CONFIG = {"dim_room": [6, 6], "num_boxes": 1, "tile_size": 16}
DESCRIPTION = "The box is below and to the left of the player. The target is below the player."


def response(rng: random.Random) -> str:
    moves = ", ".join(rng.choice(MOVES) for _ in range(2))
    return (
        f"<think><observation>{DESCRIPTION}</observation><reasoning>I go around the box."
        f"</reasoning><prediction>{DESCRIPTION}</prediction></think><answer>{moves}</answer>"
    )


def options(seed: int, encoding: str = "png") -> dict:
    return {"env": "sokoban", "config": CONFIG, "seed": seed,
            "format": "grounding_worldmodeling", "image_encoding": encoding}  # fmt: skip


@dataclass
class Result:
    name: str
    rates: list[float]  # env-steps/s per trial
    latencies: list[float]  # seconds per call
    server_cpu: float  # seconds per 1,000 env-steps
    client_cpu: float
    bytes_per_step: float
    note: str = ""

    def row(self) -> list[str]:
        lat = sorted(self.latencies)
        p50 = statistics.median(lat) * 1e3
        p99 = lat[min(len(lat) - 1, int(0.99 * len(lat)))] * 1e3
        rate = statistics.median(self.rates)
        return [self.name, f"{rate:,.0f}", f"{min(self.rates):,.0f}-{max(self.rates):,.0f}",
                f"{p50:.2f}", f"{p99:.2f}", f"{self.server_cpu:.2f}", f"{self.client_cpu:.2f}",
                f"{self.bytes_per_step:,.0f}", self.note]  # fmt: skip


HEADER = ["variant", "env-steps/s", "min-max", "p50 ms", "p99 ms", "server cpu s/1k",
          "client cpu s/1k", "bytes/step", "note"]  # fmt: skip


def measure(name: str, round_fn: Callable[[], tuple[int, int, list[float]]], args, cpu: ServerCPU,
            note: str = "") -> Result:  # fmt: skip
    """round_fn() runs one step of every session: (env-steps, bytes, call latencies)."""
    for _ in range(args.warmup):
        round_fn()
    rates, lats, steps_total, bytes_total = [], [], 0, 0
    s0, c0 = cpu.seconds(), client_cpu()
    for _ in range(args.trials):
        steps = 0
        start = time.perf_counter()
        for _ in range(args.steps):
            n, size, call_lats = round_fn()
            steps += n
            bytes_total += size
            lats += call_lats
        rates.append(steps / (time.perf_counter() - start))
        steps_total += steps
    server_cpu = (cpu.seconds() - s0) / steps_total * 1000
    client_cpu_s = (client_cpu() - c0) / steps_total * 1000
    return Result(name, rates, lats, server_cpu, client_cpu_s, bytes_total / steps_total, note)


# ---- in-process -----------------------------------------------------------------------
def in_process(args, rng: random.Random) -> tuple[Result, float]:
    """The worker's step code with no server; returns the result and the encode share."""
    encode_seconds = 0.0
    original = images_module.encode_image

    def timed_encode(array, encoding="png"):
        nonlocal encode_seconds
        t = time.perf_counter()
        out = original(array, encoding)
        encode_seconds += time.perf_counter() - t
        return out

    images_module.encode_image = timed_encode
    worker = worker_module.Worker()
    ids = [f"s-{i:016x}" for i in range(args.sessions)]
    made = [SessionOptions.model_validate(options(i)) for i in range(len(ids))]
    worker.handle([Create(sid, o, ReasoningConfig()) for sid, o in zip(ids, made, strict=True)])
    seeds = dict.fromkeys(ids, 0)

    def one_round() -> tuple[int, int, list[float]]:
        t = time.perf_counter()
        out = [s.reply for s in worker.handle([Step(sid, response(rng)) for sid in ids])]
        done = [Reset(sid) for sid, r in zip(ids, out, strict=True) if r.terminated or r.truncated]
        if done:
            worker.handle(done)
            for reset in done:
                seeds[reset.session_id] += 1
        return len(ids), 0, [time.perf_counter() - t]

    for _ in range(args.warmup):
        one_round()
    encode_seconds = 0.0
    start = time.perf_counter()
    result = measure("in-process (no server), batch 64", one_round,
                     argparse.Namespace(**{**vars(args), "warmup": 0}), ServerCPU(None))  # fmt: skip
    share = encode_seconds / (time.perf_counter() - start)
    images_module.encode_image = original
    result.note = f"encoding {share:.0%} of the time"
    return result, share


# ---- REST -----------------------------------------------------------------------------
class Rest:
    def __init__(self, url: str) -> None:
        self.http = httpx.Client(base_url=url, timeout=60)

    def post(self, path: str, body: dict) -> tuple[dict, int]:
        content = json.dumps(body).encode()
        r = self.http.post(path, content=content, headers={"content-type": "application/json"})
        r.raise_for_status()
        return r.json(), len(content) + len(r.content)

    def create(self, n: int, encoding: str, first_seed: int) -> list[dict]:
        out, _ = self.post("/v1/batch/create",
                           {"items": [options(first_seed + i, encoding) for i in range(n)]})  # fmt: skip
        assert all(r["ok"] for r in out["results"]), out
        return [r["reply"] for r in out["results"]]

    def close(self, replies: list[dict]) -> None:
        self.post("/v1/batch/close", {"session_ids": [r["session_id"] for r in replies]})


def rest_batch(rest: Rest, n: int, encoding: str, rng: random.Random):
    state = {r["session_id"]: r["step_index"] for r in rest.create(n, encoding, 1000)}

    def one_round() -> tuple[int, int, list[float]]:
        t = time.perf_counter()
        items = [{"session_id": sid, "step_index": idx, "response": response(rng)}
                 for sid, idx in state.items()]  # fmt: skip
        out, size = rest.post("/v1/batch/step", {"items": items})
        lat = [time.perf_counter() - t]
        done = []
        for item, res in zip(items, out["results"], strict=True):
            assert res["ok"], res
            reply = res["reply"]
            state[item["session_id"]] = reply["step_index"]
            if reply["terminated"] or reply["truncated"]:
                done.append({"session_id": item["session_id"]})
        if done:
            out, more = rest.post("/v1/batch/reset", {"items": done})
            size += more
            for d in done:
                state[d["session_id"]] = 0
        return len(items), size, lat

    return one_round, state


def rest_one_by_one(rest: Rest, n: int, rng: random.Random):
    state = {r["session_id"]: r["step_index"] for r in rest.create(n, "png", 2000)}

    def one_round() -> tuple[int, int, list[float]]:
        lats, size = [], 0
        for sid, idx in list(state.items()):
            t = time.perf_counter()
            reply, more = rest.post(f"/v1/sessions/{sid}/step",
                                    {"step_index": idx, "response": response(rng)})  # fmt: skip
            lats.append(time.perf_counter() - t)
            size += more
            state[sid] = reply["step_index"]
            if reply["terminated"] or reply["truncated"]:
                _, more = rest.post(f"/v1/sessions/{sid}/reset", {})
                size += more
                state[sid] = 0
        return len(state), size, lats

    return one_round, state


def rest_concurrent(url: str, rest: Rest, n: int, rng: random.Random):
    """64 single-session step calls in flight at once (asyncio + one pooled client)."""
    state = {r["session_id"]: r["step_index"] for r in rest.create(n, "png", 3000)}
    loop = asyncio.new_event_loop()
    client = httpx.AsyncClient(base_url=url, timeout=60, limits=httpx.Limits(max_connections=n))

    async def one(sid: str, idx: int) -> tuple[float, int]:
        t = time.perf_counter()
        content = json.dumps({"step_index": idx, "response": response(rng)}).encode()
        r = await client.post(f"/v1/sessions/{sid}/step", content=content,
                              headers={"content-type": "application/json"})  # fmt: skip
        r.raise_for_status()
        reply = r.json()
        size = len(content) + len(r.content)
        state[sid] = reply["step_index"]
        if reply["terminated"] or reply["truncated"]:
            r = await client.post(f"/v1/sessions/{sid}/reset", json={})
            state[sid] = 0
            size += len(r.content)
        return time.perf_counter() - t, size

    def one_round() -> tuple[int, int, list[float]]:
        async def all_of_them():
            return await asyncio.gather(*(one(s, i) for s, i in list(state.items())))

        out = loop.run_until_complete(all_of_them())
        return len(out), sum(size for _, size in out), [lat for lat, _ in out]

    return one_round, state


def start_server(workers: int) -> tuple[subprocess.Popen, str]:
    server = launch_server(workers=workers, envs="sokoban", idle_timeout=0, timeout=120,
                           ready="answers")  # fmt: skip
    return server.proc, server.url


def print_table(results: list[Result]) -> None:
    rows = [HEADER] + [r.row() for r in results]
    widths = [max(len(row[i]) for row in rows) for i in range(len(HEADER))]
    for k, row in enumerate(rows):
        print("  ".join(cell.ljust(w) if i in (0, 8) else cell.rjust(w)
                        for i, (cell, w) in enumerate(zip(row, widths, strict=True))))  # fmt: skip
        if k == 0:
            print("  ".join("-" * w for w in widths))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--sessions", type=int, default=64)
    parser.add_argument("--warmup", type=int, default=30)
    parser.add_argument("--steps", type=int, default=30, help="batched steps per trial")
    parser.add_argument("--trials", type=int, default=3)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--url", help="an already running server (CPU not measured)")
    parser.add_argument("--quick", action="store_true", help="warm-up 3, 1 trial of 5 steps")
    args = parser.parse_args()
    if args.quick:
        args.warmup, args.steps, args.trials = 3, 5, 1
    rng = random.Random(0)

    results: list[Result] = []
    ceiling, share = in_process(args, rng)
    results.append(ceiling)
    proc = None
    if args.url:
        url, cpu = args.url, ServerCPU(None)
    else:
        proc, url = start_server(args.workers)
        cpu = ServerCPU(proc.pid)
    rest = Rest(url)
    try:
        for name, make in [
            (f"REST batch {args.sessions}, png", lambda: rest_batch(rest, args.sessions, "png", rng)),
            (f"REST batch {args.sessions}, raw", lambda: rest_batch(rest, args.sessions, "raw", rng)),
            ("REST batch 1, png", lambda: rest_batch(rest, 1, "png", rng)),
            (f"REST one-by-one, {args.sessions} sessions", lambda: rest_one_by_one(rest, args.sessions, rng)),
            (f"REST one-by-one, {args.sessions} concurrent", lambda: rest_concurrent(url, rest, args.sessions, rng)),
        ]:  # fmt: skip
            one_round, state = make()
            res = measure(name, one_round, args, cpu)
            rest.close([{"session_id": s} for s in state])
            res.note = (
                f"{statistics.median(res.rates) / statistics.median(ceiling.rates):.2f}x in-process"
            )
            results.append(res)
    finally:
        if proc is not None:
            os.killpg(proc.pid, signal.SIGTERM)
            proc.wait(30)
    print(f"\nReference workload: Sokoban 6x6, 1 box, 16 px, {args.sessions} sessions, "
          f"grounding_worldmodeling, 2 random moves; {args.trials} trials x {args.steps} steps "
          f"after {args.warmup} warm-up; {args.workers} workers, {os.cpu_count()} cores\n")  # fmt: skip
    print_table(results)
    print(f"\nin-process: image encoding (PNG) took {share:.0%} of the step time")


if __name__ == "__main__":
    main()
