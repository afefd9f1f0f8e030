"""Benchmark of the primitive_skill environment (ManiSkill3, CPU physics, Vulkan render).

Prints: import and construction time, shader warm-up (first rendered frame), seconds per
primitive (simulation only) and per rendered frame, memory per extra session in one
process, and the oracle's success rate over N seeds per task.

    .venv/bin/python bench/bench_primitive_skill.py --seeds 20
    .venv/bin/python bench/bench_primitive_skill.py --seeds 3 --tasks AlignTwoCube --sessions 4
"""

from __future__ import annotations

import argparse
import statistics
import time

import psutil

TASKS = ("AlignTwoCube", "PlaceTwoCube", "StackThreeCube", "PutAppleInDrawer")


def rss_mb() -> float:
    return psutil.Process().memory_info().rss / 2**20


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, default=20, help="oracle episodes per task")
    parser.add_argument("--first-seed", type=int, default=0)
    parser.add_argument("--tasks", nargs="+", default=list(TASKS), choices=TASKS)
    parser.add_argument(
        "--sessions", type=int, default=8, help="extra sessions for the memory probe"
    )
    parser.add_argument("--image-size", type=int, default=300)
    args = parser.parse_args()

    base = rss_mb()
    t0 = time.perf_counter()
    from env_server.envs.primitive_skill import PrimitiveSkillConfig, PrimitiveSkillEnv

    print(f"import:                {time.perf_counter() - t0:6.2f} s")
    reason = PrimitiveSkillEnv.unavailable_reason()
    if reason:
        raise SystemExit(f"primitive_skill unavailable: {reason}")

    t0 = time.perf_counter()
    first = PrimitiveSkillEnv(PrimitiveSkillConfig(task=args.tasks[0], image_size=args.image_size))
    print(
        f"first env:             {time.perf_counter() - t0:6.2f} s, "
        f"{rss_mb() - base:6.0f} MB above the bare interpreter"
    )
    t0 = time.perf_counter()
    first.scene.render_rgb()
    print(f"shader warm-up:        {time.perf_counter() - t0:6.2f} s (first rendered frame)")
    frames = []
    for _ in range(10):
        t0 = time.perf_counter()
        first.scene.render_rgb()
        frames.append(time.perf_counter() - t0)
    render_s = statistics.median(frames)
    print(
        f"render:                {render_s * 1000:6.1f} ms per {args.image_size}px frame (median of 10)"
    )

    # memory per session: more envs in the same process
    before = rss_mb()
    t0 = time.perf_counter()
    extra = [
        PrimitiveSkillEnv(PrimitiveSkillConfig(task=TASKS[i % 4], image_size=args.image_size))
        for i in range(args.sessions)
    ]
    for env in extra:
        env.reset(0)
    if args.sessions:
        per = (rss_mb() - before) / args.sessions
        made = (time.perf_counter() - t0) / args.sessions
        print(
            f"per extra session:     {per:6.1f} MB, {made:5.2f} s to create + reset "
            f"({args.sessions} sessions)"
        )
    for env in extra:
        env.close()

    # oracle episodes: success rate and time per primitive
    sim_per_primitive: list[float] = []
    for task in args.tasks:
        env = (
            first
            if first.config.task == task
            else PrimitiveSkillEnv(PrimitiveSkillConfig(task=task, image_size=args.image_size))
        )
        wins, rewards, prims, t_task = 0, [], 0, time.perf_counter()
        for seed in range(args.first_seed, args.first_seed + args.seeds):
            env.reset(seed)
            while True:
                actions = env.oracle_actions()
                t0 = time.perf_counter()
                tr = env.step(actions)
                elapsed = time.perf_counter() - t0
                if tr.actions_executed:
                    sim_per_primitive.append(max(0.0, elapsed - render_s) / tr.actions_executed)
                if tr.done:
                    break
            wins += tr.success
            rewards.append(tr.reward)
            prims += tr.info["primitives_used"]
        dt = time.perf_counter() - t_task
        print(
            f"oracle {task:17s} {wins:3d}/{args.seeds} solved, mean reward "
            f"{statistics.mean(rewards):5.2f}, {prims / args.seeds:4.1f} primitives/episode, "
            f"{dt / args.seeds:5.2f} s/episode"
        )
        if env is not first:
            env.close()
    if sim_per_primitive:
        print(
            f"simulation:            {statistics.median(sim_per_primitive):6.3f} s per primitive "
            f"(median, render excluded)"
        )
    print(f"peak RSS:              {rss_mb():6.0f} MB")
    first.close()


if __name__ == "__main__":
    main()
