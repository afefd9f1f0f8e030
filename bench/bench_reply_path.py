"""CPU per reply of the reply path, phase by phase, for several checkouts in turn.

The reference workload (64 Sokoban sessions, PNG, grounding_worldmodeling, two random
moves a turn, finished sessions reset) stepped by each checkout's own worker code in a
process of its own, then what that checkout's API process does with each batch's answer:

- worker: `Worker.handle` of a batch of 64 steps (and the resets of finished sessions),
  then pickling the answer for the pipe (what a worker process spends per reply);
- unpickle: loading a batch's answer from the pipe's bytes in the API process;
- assemble: the reward assembly (`rewards.assemble_reward`; `service.` before the split) and the check that the
  reply can be written (`rewards.writable`, where the checkout has it);
- gRPC: `wire.batch_to_proto` of the 64 replies and the message's serialization;
- REST: the batch reply's JSON body as the REST API writes it (Starlette's JSONResponse).

CPU microseconds per reply (process time, best of `--repeat` passes over the recorded
answers for the API phases), so the checkouts can be compared phase by phase; the rounds
alternate the checkouts, as a loaded machine weighs on them alike.

    python bench/bench_reply_path.py ../today . --rounds 3
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import pickle
import random
import statistics
import subprocess
import sys
import time
from pathlib import Path

PHASES = ("worker", "unpickle", "assemble", "gRPC", "REST")


def drive(warmup: int, steps: int, repeat: int) -> None:
    """In the checkout's own process: print one `phase=us` per phase."""
    sys.path.insert(0, str(Path.cwd() / "bench"))
    import bench_transport as bt

    from env_server.reasoning import ReasoningConfig

    try:  # where the reward is assembled: its own module since the service split
        from env_server.service import rewards as service
    except ImportError:
        from env_server.service import service
    from env_server.service.messages import Create, Reset, Step, Stepped
    from env_server.service.worker import Worker
    from visenv import wire

    worker = Worker()
    worker.preload(["sokoban"])
    gc.freeze()  # as a worker process does after start-up
    n = 64
    ids = [f"s-{i:016x}" for i in range(n)]
    options = {"env": "sokoban", "config": bt.CONFIG, "format": "grounding_worldmodeling",
               "image_encoding": "png"}  # fmt: skip
    if "reasoning" in Create.__slots__:  # validated options travel (issue 27 on)
        from env_server.service.models import SessionOptions

        reasoning = ReasoningConfig()
        made = [SessionOptions.model_validate({**options, "seed": i}) for i in range(n)]
        worker.handle([Create(sid, o, reasoning) for sid, o in zip(ids, made, strict=True)])
    else:  # options as JSON (the checkouts before issue 27)
        worker.handle([Create(sid, {**options, "seed": i}) for i, sid in enumerate(ids)])
    seeds, rng = list(range(n)), random.Random(0)
    recorded: list[bytes] = []

    def one(keep: bool) -> None:
        answers = worker.handle([Step(sid, bt.response(rng)) for sid in ids])
        data = pickle.dumps((1, answers), protocol=pickle.HIGHEST_PROTOCOL)
        done = [i for i, a in enumerate(answers) if a.reply.terminated or a.reply.truncated]
        for i in done:
            seeds[i] += n
        if done:
            worker.handle([Reset(ids[i], seeds[i]) for i in done])
        if keep:
            recorded.append(data)

    for _ in range(warmup):
        one(False)
    cpu = time.process_time()
    for _ in range(steps):
        one(True)
    worker_us = (time.process_time() - cpu) / (steps * n) * 1e6

    cfg = ReasoningConfig()
    writable = getattr(service, "writable", None)
    best = dict.fromkeys(PHASES[1:], float("inf"))
    for _ in range(repeat):
        spent = dict.fromkeys(PHASES[1:], 0.0)
        for data in recorded:
            t0 = time.process_time()
            _, answers = pickle.loads(data)
            t1 = time.process_time()
            replies = []
            for a in answers:
                assert isinstance(a, Stepped)
                reply = service.assemble_reward(a, a.score, cfg, 0.0)
                if writable is not None:
                    reply = writable(reply)[1]
                replies.append(reply)
            t2 = time.process_time()
            wire.batch_to_proto(replies).SerializeToString()
            t3 = time.process_time()
            json.dumps({"results": [wire.batch_item_json(r) for r in replies]},
                       ensure_ascii=False, allow_nan=False, indent=None,
                       separators=(",", ":")).encode()  # fmt: skip
            t4 = time.process_time()
            spent["unpickle"] += t1 - t0
            spent["assemble"] += t2 - t1
            spent["gRPC"] += t3 - t2
            spent["REST"] += t4 - t3
        for phase, s in spent.items():
            best[phase] = min(best[phase], s / (steps * n) * 1e6)
    print(" ".join([f"worker={worker_us:.2f}", *(f"{p}={us:.2f}" for p, us in best.items())]))


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("checkouts", type=Path, nargs="*")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--warmup", type=int, default=10, help="batched steps before recording")
    parser.add_argument("--steps", type=int, default=30, help="batched steps recorded per run")
    parser.add_argument("--repeat", type=int, default=5, help="passes over the recorded answers")
    parser.add_argument("--drive", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.drive:
        drive(args.warmup, args.steps, args.repeat)
        return
    checkouts = [c.resolve() for c in args.checkouts]
    runs: dict[Path, list[dict[str, float]]] = {c: [] for c in checkouts}
    for n in range(args.rounds):
        for c in checkouts:
            out = subprocess.run(
                [sys.executable, str(Path(__file__).resolve()), "--drive", "--warmup",
                 str(args.warmup), "--steps", str(args.steps), "--repeat", str(args.repeat)],
                cwd=c, env={**os.environ, "PYTHONPATH": str(c)}, check=True,
                capture_output=True, text=True,
            ).stdout.split()  # fmt: skip
            row = {k: float(v) for k, v in (field.split("=") for field in out)}
            runs[c].append(row)
            print(f"round {n + 1} {c.name}: " + " ".join(f"{k} {v:.1f}" for k, v in row.items()),
                  flush=True)  # fmt: skip
    print("\nmedian CPU us per reply, by phase (API process: unpickle + assemble + gRPC):\n")
    print("| checkout | " + " | ".join(PHASES) + " | API (gRPC) |")
    print("|---|" + "---:|" * (len(PHASES) + 1))
    for c in checkouts:
        med = {p: statistics.median(r[p] for r in runs[c]) for p in PHASES}
        api = med["unpickle"] + med["assemble"] + med["gRPC"]
        print(f"| {c.name} | " + " | ".join(f"{med[p]:.1f}" for p in PHASES) + f" | {api:.1f} |")


if __name__ == "__main__":
    main()
