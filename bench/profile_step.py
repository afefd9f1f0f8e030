"""Where a step's time goes: py-spy over the reference workload (../shared/BENCHMARKS.md),
stepped in-process and served over gRPC in batches of 64.

    python bench/profile_step.py                        # this checkout, both modes
    python bench/profile_step.py --checkout ../before   # another checkout's code, same driver
    python bench/profile_step.py --seconds 30 --keep out/   # keep py-spy's raw stacks

In-process: the worker's own step code in one process (as `bench_transport.py`'s
"in-process" variant), sampled as a whole. Served: `visenv serve --workers 2` started from
the checkout, 64 sessions stepped in batches by this process over gRPC while py-spy samples
the API process and one worker at once. For each profile a table of the inclusive share of
samples in the parts of a step (parsing, the environment's move, grading, rendering,
encoding, ...), then the lines most samples sat in (the leaf frames). In the served
processes only the thread holding the GIL is sampled (py-spy --gil): Python's share of
the CPU, without gRPC's C core or an encoder that lets the GIL go. Needs py-spy
(`pip install py-spy`) and the right to ptrace (root, or ptrace_scope 0).

The driver speaks the worker protocol of this repository's checkout (typed messages), so
`--checkout` takes checkouts from the typed messages on (commit 4c78adb and later).
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
# the in-process driver (a child process) runs the code of the checkout being profiled,
# and that checkout's bench_transport (which puts its own checkout first on the path)
CHECKOUT = Path(os.environ.get("VISENV_CHECKOUT", str(ROOT)))
sys.path.insert(0, str(CHECKOUT))
sys.path.insert(0, str(CHECKOUT / "bench"))

# inclusive parts of a step: a sample counts for every part one of its frames matches
PARTS: list[tuple[str, str]] = [
    ("worker: step (all of it)", r"Worker\._step \("),
    ("worker: reset (all of it)", r"Worker\._reset \("),
    ("  response parsing", r"(^|\.)parse_response \("),
    ("  environment move (rules, reward)", r"(^|\.)_apply \("),
    ("  world-model grading", r"(^|\.)score_turn \("),
    ("  rendering", r"SokobanEnv\.render \("),
    ("  ground truth", r"SokobanEnv\.ground_truth \("),
    ("  level generation (reset)", r"(^|\.)generate \(.*level\.py"),
    ("  reply: image encoding", r"ImageCache\.encode \("),
    ("    PNG encoder", r"(^|\.)encode_image \("),
    ("  reply: prompts", r"(^|\.)(turn_prompt|system_prompt) \("),
    ("  reply: plain types", r"(^|\.)plain \(.*types\.py"),
    ("worker: pipe (pickle, send, receive)", r"LEAF worker_main \("),
    ("API: gRPC step handler", r"(^|\.)Step \(.*grpc_server\.py"),
    ("API: replies to protobuf", r"(^|\.)(fill_proto|to_proto) \("),
    (
        "API: worker pipe (pickle, send, receive)",
        r"(_read_loop|_send|_call|call) \(.*(service|pool|worker_handle)\.py",
    ),
    ("API: reward assembly and guard", r"(^|\.)(assemble_reward|_penalty|penalty) \("),
]


def load(path: Path) -> list[tuple[list[str], int]]:
    rows = []
    for line in path.read_text().splitlines():
        if line.strip():
            stack, n = line.rsplit(" ", 1)
            rows.append((stack.split(";"), int(n)))
    return rows


def parts(rows: list[tuple[list[str], int]]) -> dict[str, float]:
    total = sum(n for _, n in rows) or 1
    out = {}
    for label, pattern in PARTS:
        if pattern.startswith("LEAF "):  # the sample's own line is in this function
            rx = re.compile(pattern.removeprefix("LEAF "))
            share = sum(n for stack, n in rows if rx.search(stack[-1])) / total
        else:
            rx = re.compile(pattern)
            share = sum(n for stack, n in rows if any(rx.search(f) for f in stack)) / total
        if share:
            out[label] = share
    return out


def leaves(rows: list[tuple[list[str], int]], top: int) -> list[tuple[str, float]]:
    counts: collections.Counter[str] = collections.Counter()
    for stack, n in rows:
        counts[re.sub(r"\S*site-packages/", "", stack[-1])] += n
    total = sum(counts.values()) or 1
    return [(frame, n / total) for frame, n in counts.most_common(top)]


def report(name: str, path: Path, top: int, within: str | None = None) -> None:
    """The tables of one profile; `within`: only the samples with a frame matching it."""
    rows = load(path)
    if within is not None:
        rx = re.compile(within)
        rows = [(stack, n) for stack, n in rows if any(rx.search(f) for f in stack)]
    print(f"\n## {name}: {sum(n for _, n in rows)} samples\n")
    print("| part | share |\n|---|---:|")
    for label, share in parts(rows).items():
        print(f"| {label} | {share * 100:.1f}% |")
    print("\n| line (leaf frame) | share |\n|---|---:|")
    for frame, share in leaves(rows, top):
        print(f"| `{frame}` | {share * 100:.1f}% |")


# ---- the in-process driver (a child process, under py-spy) -------------------------------


def drive_in_process(seconds: float) -> None:
    import gc
    import random

    import bench_transport as bt

    from env_server.reasoning import ReasoningConfig
    from env_server.service.messages import Create, Reset, Step
    from env_server.service.models import SessionOptions
    from env_server.service.worker import Worker

    worker = Worker()
    worker.preload(["sokoban"])
    gc.freeze()
    n = 64
    ids = [f"s-{i:016x}" for i in range(n)]
    options = {"env": "sokoban", "config": bt.CONFIG, "format": "grounding_worldmodeling",
               "image_encoding": "png"}  # fmt: skip
    made = [SessionOptions.model_validate({**options, "seed": i}) for i in range(n)]
    worker.handle([Create(sid, o, ReasoningConfig()) for sid, o in zip(ids, made, strict=True)])
    seeds, rng = list(range(n)), random.Random(0)
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        stepped = worker.handle([Step(sid, bt.response(rng)) for sid in ids])
        done = [i for i, s in enumerate(stepped) if s.reply.terminated or s.reply.truncated]
        for i in done:
            seeds[i] += n
        worker.handle([Reset(ids[i], seeds[i]) for i in done])


# ---- the served run ----------------------------------------------------------------------


def start_server(checkout: Path):
    """`visenv serve` of `checkout` (sokoban, 2 workers) once its banner is out."""
    from env_server.testing.launcher import launch_server

    return launch_server(workers=2, envs="sokoban", timeout=180, ready="banner", cwd=checkout,
                         inherit_env=True)  # fmt: skip


async def drive_served(address: str, seconds: float) -> int:
    import random

    import bench_transport as bt

    from clients import AsyncEnvClient, SessionOptions

    n, steps = 64, 0
    async with AsyncEnvClient(address, transport="grpc", timeout=120) as client:
        options = [SessionOptions("sokoban", config=bt.CONFIG, seed=i,
                                  format="grounding_worldmodeling") for i in range(n)]  # fmt: skip
        ids = [r.session_id for r in await client.create(options)]
        seeds, rng = list(range(n)), random.Random(0)
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            replies = await client.step(ids, [bt.response(rng) for _ in ids])
            steps += n
            done = [i for i, r in enumerate(replies) if r.done]
            for i in done:
                seeds[i] += n
            if done:
                await client.reset([ids[i] for i in done], [seeds[i] for i in done])
    return steps


def spy(pid: int | None, out: Path, seconds: float, command: list[str] | None = None,
        env: dict | None = None, cwd: Path | None = None) -> subprocess.Popen:  # fmt: skip
    base = ["py-spy", "record", "--rate", "200", "--format", "raw", "--output", str(out)]
    if command is not None:
        return subprocess.Popen([*base, "--", *command], env=env, cwd=cwd,
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)  # fmt: skip
    # a server: only the thread holding the GIL, the one running Python (its idle pool
    # threads otherwise look busy)
    return subprocess.Popen([*base, "--gil", "--pid", str(pid), "--duration", str(int(seconds))],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--checkout", type=Path, default=ROOT, help="the code to profile")
    parser.add_argument("--seconds", type=float, default=20)
    parser.add_argument("--top", type=int, default=10, help="leaf lines to list")
    parser.add_argument("--only", choices=["in-process", "served"])
    parser.add_argument("--keep", type=Path, help="keep the raw stacks in this folder")
    parser.add_argument("--drive-in-process", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.drive_in_process:
        drive_in_process(args.seconds)
        return
    if shutil.which("py-spy") is None and not Path(sys.executable).with_name("py-spy").exists():
        raise SystemExit("py-spy is not installed: pip install py-spy")
    os.environ["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"
    checkout = args.checkout.resolve()
    out = args.keep or Path(tempfile.mkdtemp(prefix="visenv-profile-"))
    out.mkdir(parents=True, exist_ok=True)
    print(f"# profile of {checkout}, {args.seconds:.0f} s per run")
    env = {**os.environ, "VISENV_CHECKOUT": str(checkout), "PYTHONPATH": str(checkout)}
    if args.only in (None, "in-process"):
        raw = out / "in-process.raw"
        command = [sys.executable, str(Path(__file__).resolve()), "--drive-in-process",
                   "--seconds", str(args.seconds)]  # fmt: skip
        spy(None, raw, args.seconds, command, env=env, cwd=checkout).wait()
        # the stepping only, not the start-up's imports
        report("in-process, 64 sessions", raw, args.top, within=r"Worker\.handle \(")
    if args.only in (None, "served"):
        served = start_server(checkout)
        proc, address = served.proc, served.grpc
        try:
            import psutil

            loop = asyncio.new_event_loop()
            task = loop.create_task(drive_served(address, args.seconds + 8))
            loop.run_until_complete(asyncio.sleep(4))  # sessions made, stepping
            # a worker: the child of the API process that works most now (the forkserver
            # that started the workers worked most before)
            children = psutil.Process(proc.pid).children(recursive=True)
            before = {c.pid: sum(c.cpu_times()[:2]) for c in children}
            loop.run_until_complete(asyncio.sleep(1))
            worker = max(children, key=lambda c: sum(c.cpu_times()[:2]) - before[c.pid]).pid
            spies = [spy(proc.pid, out / "api.raw", args.seconds),
                     spy(worker, out / "worker.raw", args.seconds)]  # fmt: skip
            steps = loop.run_until_complete(task)
            for s in spies:
                s.wait()
        finally:
            served.stop()
        print(f"\n(served: {steps} env-steps over gRPC in batches of 64)")
        report("served: API process", out / "api.raw", args.top)
        report("served: one worker process", out / "worker.raw", args.top)


if __name__ == "__main__":
    main()
