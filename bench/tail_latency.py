"""Where does the batch-64 tail come from? Per-step attribution on the reference workload.

Runs bench_transport's workload (Sokoban 6x6, 64 sessions, PNG, 2 random moves a turn,
finished sessions reset) in-process, one worker, with no transport, and records for each
batched step: wall time, this process's CPU time, the time spent in garbage collection
(gc.callbacks) and how many of the 64 sessions had just been reset. A slow step is then
put down to one of:

  - gc:        a collection ran during it and took most of the excess over the median;
  - preempted: wall time well above CPU time (another process had the core);
  - work:      neither: the step itself did more (e.g. more sessions in a costly state).

Run it on a quiet machine; run it beside a loaded one to see the `preempted` share grow.

    .venv/bin/python bench/tail_latency.py [--steps 600] [--gc-freeze]
"""

from __future__ import annotations

import argparse
import gc
import json
import random
import statistics
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_transport import CONFIG, response  # noqa: E402

from env_server.reasoning import ReasoningConfig  # noqa: E402
from env_server.service.messages import Create, Reset, Step  # noqa: E402
from env_server.service.models import SessionOptions  # noqa: E402
from env_server.service.worker import Worker  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sessions", type=int, default=64)
    parser.add_argument("--steps", type=int, default=600)
    parser.add_argument("--warmup", type=int, default=30)
    parser.add_argument(
        "--gc-freeze", action="store_true", help="gc.freeze() after set-up, as workers do"
    )
    parser.add_argument("--json", help="also write the per-step records here")
    args = parser.parse_args()

    gc_spent = [0.0]
    gc_start = [0.0]

    def on_gc(phase: str, info: dict) -> None:
        if phase == "start":
            gc_start[0] = time.perf_counter()
        else:
            gc_spent[0] += time.perf_counter() - gc_start[0]

    worker = Worker()
    n = args.sessions
    ids = [f"s-{i:016x}" for i in range(n)]
    options = {"env": "sokoban", "config": CONFIG, "format": "grounding_worldmodeling",
               "image_encoding": "png"}  # fmt: skip
    made = [SessionOptions.model_validate({**options, "seed": i}) for i in range(n)]
    worker.handle([Create(sid, o, ReasoningConfig()) for sid, o in zip(ids, made, strict=True)])
    seeds = list(range(n))
    if args.gc_freeze:
        gc.freeze()
    gc.callbacks.append(on_gc)
    rng = random.Random(0)
    records = []
    fresh = 0
    for i in range(args.warmup + args.steps):
        texts = [response(rng) for _ in range(n)]
        gc_spent[0] = 0.0
        w0, c0 = time.perf_counter(), time.process_time()
        stepped = worker.handle([Step(sid, t) for sid, t in zip(ids, texts, strict=True)])
        replies = [s.reply for s in stepped]
        wall, cpu = time.perf_counter() - w0, time.process_time() - c0
        if i >= args.warmup:
            records.append({"wall": wall, "cpu": cpu, "gc": gc_spent[0], "fresh": fresh})
        done = [p for p, r in enumerate(replies) if r.terminated or r.truncated]
        for p in done:
            seeds[p] += n
        if done:
            worker.handle([Reset(ids[p], seeds[p]) for p in done])
        fresh = len(done)

    walls = np.array([r["wall"] for r in records]) * 1000
    p50, p99 = float(np.percentile(walls, 50)), float(np.percentile(walls, 99))
    slow = [r for r in records if r["wall"] * 1000 > 2 * p50]
    causes = {"gc": 0, "preempted": 0, "work": 0}
    for r in slow:
        excess = r["wall"] - p50 / 1000
        if r["gc"] > 0.5 * excess:
            causes["gc"] += 1
        elif r["wall"] > 1.3 * r["cpu"]:
            causes["preempted"] += 1
        else:
            causes["work"] += 1
    no_gc = np.array([r["wall"] for r in records if r["gc"] == 0]) * 1000
    with_gc = [r for r in records if r["gc"] > 0]
    report = {
        "steps": len(records),
        "sessions": n,
        "gc_freeze": args.gc_freeze,
        "p50_ms": p50,
        "p99_ms": p99,
        "p99_over_p50": p99 / p50,
        "p99_ms_steps_without_gc": float(np.percentile(no_gc, 99)) if len(no_gc) else None,
        "steps_with_gc": len(with_gc),
        "gc_ms_max": max((r["gc"] * 1000 for r in with_gc), default=0.0),
        "gc_ms_median_when_run": statistics.median([r["gc"] * 1000 for r in with_gc])
        if with_gc
        else 0.0,
        "cpu_ms_p50": float(np.percentile([r["cpu"] * 1000 for r in records], 50)),
        "cpu_ms_p99": float(np.percentile([r["cpu"] * 1000 for r in records], 99)),
        "steps_over_2x_p50": len(slow),
        "causes_of_steps_over_2x_p50": causes,
        "corr_wall_fresh_sessions": float(np.corrcoef(walls, [r["fresh"] for r in records])[0, 1]),
    }
    print(json.dumps(report, indent=1))
    if args.json:
        Path(args.json).write_text(json.dumps({"report": report, "records": records}))


if __name__ == "__main__":
    main()
