"""Fork benchmark: the latency and memory of a session fork, per environment, beside a reset's.

For each environment, in one EnvService with one worker process (real envs, no network):

1. create a session and play one turn (a fork copies a state past its start);
2. reset: the mean wall time of `--repeat` resets of one session (EnvService.reset);
3. fork: the mean wall time of `--repeat` forks of n=1 (each fork closed after), and of one
   fork of n=`--n` divided by n (the batch cost per fork);
4. memory: the worker's USS before and after `--n` forks, divided by n, beside the same for
   `--n` new sessions (create), each in a fresh worker after the same warm-up.

    python bench/bench_fork.py                           # every env
    python bench/bench_fork.py --envs sokoban,frozenlake --repeat 20 --n 8
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import time

import psutil

from env_server.service import EnvService, SessionReply, Settings

ENVS = ["sokoban", "frozenlake", "svg", "vicrit", "navigation", "primitive_skill"]
FIRST_TURN = {
    "sokoban": "Left",
    "frozenlake": "Right",
    "svg": "<svg xmlns='http://www.w3.org/2000/svg' width='64' height='64'>"
    "<circle cx='32' cy='32' r='20' fill='red'/></svg>",
    "vicrit": "a purple elephant",
    "navigation": "moveahead",
    "primitive_skill": "pick(62, -55, 20)",
}


def uss_mb(pid: int) -> float:
    return psutil.Process(pid).memory_full_info().uss / 2**20


async def timed(coro) -> tuple[float, object]:
    t0 = time.perf_counter()
    out = await coro
    return time.perf_counter() - t0, out


def ok(results: list) -> list:
    for r in results:
        if not isinstance(r, SessionReply | list):
            raise RuntimeError(f"call failed: {r!r}")
    return results


async def _source(service: EnvService, env: str) -> str:
    """A session one turn in, and one fork of it made and closed (warm-up: the first
    fork or reset of a process may import modules or build caches)."""
    (source,) = ok(await service.create([{"env": env, "seed": 1, "format": "no_think"}]))
    sid = source.session_id
    ok(await service.step([{"session_id": sid, "step_index": 0,
                            "response": f"<answer>{FIRST_TURN[env]}</answer>"}]))  # fmt: skip
    (warm,) = ok(await service.fork([{"session_id": sid, "n": 1}]))
    await service.close([warm[0].session_id])
    return sid


def _service(env: str, n: int) -> EnvService:
    return EnvService(Settings(workers=1, envs=[env], max_sessions=2 * n + 8, idle_timeout=0))


async def bench_env(env: str, repeat: int, n: int) -> dict:
    async with _service(env, n) as service:  # times
        sid = await _source(service, env)
        resets, forks = [], []
        (spare,) = ok(await service.create([{"env": env, "seed": 2, "format": "no_think"}]))
        for i in range(repeat):
            seconds, _ = await timed(service.reset([{"session_id": spare.session_id, "seed": i}]))
            resets.append(seconds)
        for _ in range(repeat):
            seconds, (made,) = await timed(service.fork([{"session_id": sid, "n": 1}]))
            forks.append(seconds)
            await service.close([r.session_id for r in ok([made])[0]])
        fork_batch, (batch,) = await timed(service.fork([{"session_id": sid, "n": n}]))
        ok([batch])
        create_batch, created = await timed(
            service.create([{"env": env, "seed": 3 + i, "format": "no_think"} for i in range(n)])
        )
        ok(created)
    memory = {}
    for kind in ("fork", "create"):  # each in a fresh worker: no pool the other one freed
        async with _service(env, n) as service:
            sid = await _source(service, env)
            pid = service.workers[0].pid
            before = uss_mb(pid)
            if kind == "fork":
                ok(await service.fork([{"session_id": sid, "n": n}]))
            else:
                ok(await service.create([{"env": env, "seed": 3 + i, "format": "no_think"}
                                         for i in range(n)]))  # fmt: skip
            memory[kind] = (uss_mb(pid) - before) / n
    return {
        "env": env,
        "reset_ms": round(1000 * statistics.mean(resets), 2),
        "fork_ms": round(1000 * statistics.mean(forks), 2),
        f"fork_ms_per_fork_of_{n}": round(1000 * fork_batch / n, 2),
        f"create_ms_per_session_of_{n}": round(1000 * create_batch / n, 2),
        "fork_mb": round(memory["fork"], 2),
        "create_mb": round(memory["create"], 2),
    }


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--envs", default=",".join(ENVS))
    parser.add_argument("--repeat", type=int, default=10, help="resets and forks timed")
    parser.add_argument("--n", type=int, default=8, help="forks (and creates) in one call")
    args = parser.parse_args()
    for env in args.envs.split(","):
        print(json.dumps(await bench_env(env, args.repeat, args.n)), flush=True)


if __name__ == "__main__":
    asyncio.run(main())
