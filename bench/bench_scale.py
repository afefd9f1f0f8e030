"""Scale benchmark: many concurrent Sokoban sessions on one server, and memory per session.

Starts one `visenv serve` (2 workers by default), then:

1. warms the server up (a few sessions created and closed: imports and caches are not
   per-session memory) and reads the RSS and USS of the server's processes (API process
   + workers);
2. creates `--sessions` Sokoban sessions (the reference workload's config) in batches of
   `--batch` and reads the memory again: (after - before) / sessions is the memory of one
   idle session;
3. steps every session `--steps` times: each round sends all batches at once (concurrent
   batched calls over gRPC), each response well-formed with 2 random moves; sessions
   that finish are reset. Every item that answers an error counts as a failed step.

Targets (../shared/BENCHMARKS.md): 2,048 concurrent sessions on one 2-core server
with no failed step; an idle Sokoban session at most 1 MB of server memory.

    python bench/bench_scale.py                    # 2,048 sessions, 3 rounds of steps
    python bench/bench_scale.py --sessions 256     # a smaller run
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import sys
import time
from pathlib import Path

import psutil

sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_transport import CONFIG, response, start_server  # noqa: E402

from clients import AsyncEnvClient, SessionOptions  # noqa: E402

MiB = 1024 * 1024


def server_memory(pid: int) -> tuple[float, float]:
    """(RSS, USS) in bytes summed over the server process and its descendants."""
    root = psutil.Process(pid)
    rss = uss = 0.0
    for p in [root, *root.children(recursive=True)]:
        try:
            info = p.memory_full_info()
        except psutil.NoSuchProcess:
            continue
        rss += info.rss
        uss += info.uss
    return rss, uss


def options(seed: int) -> SessionOptions:
    return SessionOptions(
        "sokoban", config=CONFIG, seed=seed, format="grounding_worldmodeling", image_encoding="png"
    )


def chunks(xs: list, n: int) -> list[list]:
    return [xs[i : i + n] for i in range(0, len(xs), n)]


async def settle(pid: int) -> tuple[float, float]:
    """Memory once the server has finished what it was doing (a short pause, then read)."""
    await asyncio.sleep(1.0)
    return server_memory(pid)


async def run(args: argparse.Namespace) -> dict:
    served = start_server(args.workers)
    proc, address = served.proc, served.grpc
    try:
        async with AsyncEnvClient(address, transport="grpc", timeout=300) as client:
            # warm-up: imports, caches and the first allocations of each worker
            warm = await client.create([options(10**6 + i) for i in range(4 * args.workers)])
            await client.close([r.session_id for r in warm])
            rss0, uss0 = await settle(proc.pid)

            t0 = time.perf_counter()
            ids: list[str] = []
            create_failed = 0
            for batch in chunks(list(range(args.sessions)), args.batch):
                out = await client.create([options(s) for s in batch], return_exceptions=True)
                for r in out:
                    if isinstance(r, BaseException):
                        create_failed += 1
                    else:
                        ids.append(r.session_id)
            create_s = time.perf_counter() - t0
            rss1, uss1 = await settle(proc.pid)

            rng = random.Random(0)
            seeds = {sid: n for n, sid in enumerate(ids)}
            failed = steps = resets = 0
            errors: dict[str, int] = {}
            step_s = 0.0
            for _ in range(args.steps):
                groups = chunks(ids, args.batch)
                t = time.perf_counter()
                answers = await asyncio.gather(
                    *(
                        client.step(g, [response(rng) for _ in g], return_exceptions=True)
                        for g in groups
                    )
                )
                step_s += time.perf_counter() - t
                done: list[str] = []
                for group, out in zip(groups, answers, strict=True):
                    for sid, r in zip(group, out, strict=True):
                        steps += 1
                        if isinstance(r, BaseException):
                            failed += 1
                            name = getattr(r, "code", type(r).__name__)
                            errors[name] = errors.get(name, 0) + 1
                        elif r.done:
                            done.append(sid)
                for group in chunks(done, args.batch):
                    for sid in group:
                        seeds[sid] += args.sessions
                    out = await client.reset(
                        group, [seeds[s] for s in group], return_exceptions=True
                    )
                    resets += len(group)
                    failed += sum(isinstance(r, BaseException) for r in out)
            rss2, uss2 = await settle(proc.pid)
            await client.close(ids)
    finally:
        served.stop()
    n = max(len(ids), 1)
    return {
        "sessions": args.sessions,
        "workers": args.workers,
        "created": len(ids),
        "create_failed": create_failed,
        "create_s": round(create_s, 2),
        "steps": steps,
        "failed_steps": failed,
        "errors": errors,
        "resets": resets,
        "step_rate": round(steps / step_s, 1) if step_s else None,
        "rss_before_MiB": round(rss0 / MiB, 1),
        "rss_created_MiB": round(rss1 / MiB, 1),
        "rss_stepped_MiB": round(rss2 / MiB, 1),
        "rss_per_idle_session_KiB": round((rss1 - rss0) / n / 1024, 1),
        "uss_per_idle_session_KiB": round((uss1 - uss0) / n / 1024, 1),
        "rss_per_session_after_steps_KiB": round((rss2 - rss0) / n / 1024, 1),
    }


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--sessions", type=int, default=2048)
    parser.add_argument("--batch", type=int, default=256, help="sessions per batched call")
    parser.add_argument("--steps", type=int, default=3, help="rounds of steps of every session")
    parser.add_argument("--workers", type=int, default=2, help="server worker processes")
    parser.add_argument("--json", help="also write the result here")
    args = parser.parse_args()
    result = asyncio.run(run(args))
    print(json.dumps(result, indent=1))
    print(
        f"{result['created']:,} sessions on {args.workers} workers: "
        f"{result['failed_steps']} failed steps of {result['steps']:,} (target 0); "
        f"idle session {result['rss_per_idle_session_KiB']:.0f} KiB RSS, "
        f"{result['uss_per_idle_session_KiB']:.0f} KiB USS (target <= 1,024 KiB)"
    )
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=1))
    if result["failed_steps"] or result["create_failed"]:
        sys.exit(1)


if __name__ == "__main__":
    main()
