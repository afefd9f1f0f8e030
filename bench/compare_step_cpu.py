"""CPU per env-step of the in-process reference workload, for several checkouts in turn.

The workload of `bench_transport.py`'s "in-process" variant (64 Sokoban sessions, PNG,
grounding_worldmodeling, two random moves a turn, finished sessions reset), stepped by each
checkout's own worker code in a process of its own; the checkouts take turns, round after
round, and each run reports the process's CPU microseconds per env-step (process time,
which a loaded machine disturbs less than the wall-clock rate).

    git worktree add ../before <commit>
    python bench/compare_step_cpu.py ../before . --rounds 4

Works with checkouts before the typed worker messages (commit 4c78adb) too.
"""

from __future__ import annotations

import argparse
import gc
import os
import random
import statistics
import subprocess
import sys
import time
from pathlib import Path


def drive(warmup: int, steps: int, encoding: str) -> None:
    """In the checkout's own process: print CPU us per env-step and env-steps/s."""
    sys.path.insert(0, str(Path.cwd() / "bench"))
    import bench_transport as bt

    from env_server.service.worker import Worker

    worker = Worker()
    try:
        from env_server.service.messages import Create, Reset, Step
    except ImportError:  # the worker protocol before typed messages: (op, tuples)

        def create(items):
            return worker.handle("create", items)

        def step(items):
            return worker.handle("step", [(s, t, None, None) for s, t in items])

        def reset(items):
            worker.handle("reset", [(s, seed, None) for s, seed in items])
    else:
        worker.preload(["sokoban"])

        def create(items):
            if "reasoning" not in Create.__slots__:  # options as JSON (before issue 27)
                return worker.handle([Create(s, o) for s, o in items])
            from env_server.reasoning import ReasoningConfig
            from env_server.service.models import SessionOptions

            made = [(s, SessionOptions.model_validate(o)) for s, o in items]
            return worker.handle([Create(s, o, ReasoningConfig()) for s, o in made])

        def step(items):
            return [x.reply for x in worker.handle([Step(s, t) for s, t in items])]

        def reset(items):
            worker.handle([Reset(s, seed) for s, seed in items])

    gc.freeze()  # as a worker process does after start-up
    n = 64
    ids = [f"s-{i:016x}" for i in range(n)]
    options = {"env": "sokoban", "config": bt.CONFIG, "format": "grounding_worldmodeling",
               "image_encoding": encoding}  # fmt: skip
    create([(sid, {**options, "seed": i}) for i, sid in enumerate(ids)])
    seeds, rng = list(range(n)), random.Random(0)

    def one() -> None:
        replies = step([(sid, bt.response(rng)) for sid in ids])
        done = [i for i, r in enumerate(replies) if r.terminated or r.truncated]
        for i in done:
            seeds[i] += n
        if done:
            reset([(ids[i], seeds[i]) for i in done])

    for _ in range(warmup):
        one()
    cpu, wall = time.process_time(), time.perf_counter()
    for _ in range(steps):
        one()
    count = steps * n
    print(
        f"{(time.process_time() - cpu) / count * 1e6:.1f} {count / (time.perf_counter() - wall):.0f}"
    )


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("checkouts", type=Path, nargs="*")
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--warmup", type=int, default=15, help="batched steps before measuring")
    parser.add_argument("--steps", type=int, default=60, help="batched steps measured per run")
    parser.add_argument("--encoding", default="png", choices=["png", "raw"])
    parser.add_argument("--drive", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.drive:
        drive(args.warmup, args.steps, args.encoding)
        return
    checkouts = [c.resolve() for c in args.checkouts]
    cpu: dict[Path, list[float]] = {c: [] for c in checkouts}
    for n in range(args.rounds):
        line = []
        for c in checkouts:
            out = subprocess.run(
                [sys.executable, str(Path(__file__).resolve()), "--drive", "--warmup",
                 str(args.warmup), "--steps", str(args.steps), "--encoding", args.encoding],
                cwd=c, env={**os.environ, "PYTHONPATH": str(c)}, check=True,
                capture_output=True, text=True,
            ).stdout.split()  # fmt: skip
            cpu[c].append(float(out[0]))
            line.append(f"{c.name}: {out[0]} us/step ({out[1]} steps/s)")
        print(f"round {n + 1}: " + " | ".join(line), flush=True)
    first = checkouts[0]
    print("\nmedian CPU us per env-step, and the rounds' speed-up over the first checkout:")
    for c in checkouts:
        ratios = [a / b for a, b in zip(cpu[first], cpu[c], strict=True)]
        print(f"  {c.name:24} {statistics.median(cpu[c]):7.1f}   "
              f"{statistics.median(ratios):.2f}x ({min(ratios):.2f}-{max(ratios):.2f})")  # fmt: skip


if __name__ == "__main__":
    main()
