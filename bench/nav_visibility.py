"""Benchmark: how often a Navigation reset starts with something in view (MiniWorld backend).

For each of the five task sets and seeds 0..N-1, resets the environment and reads the
first ground truth: the share of starts with at least one object visible (the target or
another object), and the share with the target itself visible. A start facing a wall, with
nothing in view, gives the agent nothing to go on.

    .venv/bin/python bench/nav_visibility.py [--seeds 200] [--image-size 64]

The image size does not change visibility (the field of view is fixed); a small one keeps
the run short.
"""

from __future__ import annotations

import argparse
import time

from env_server.envs.navigation import NavigationConfig, NavigationEnv
from env_server.envs.navigation.tasks import TASK_SETS


def sees_something(ground_truth: dict) -> bool:
    return bool(ground_truth["target"]["visible"] or ground_truth["objects"])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, default=200, help="resets per task set")
    parser.add_argument("--image-size", type=int, default=64)
    args = parser.parse_args()
    print(f"{args.seeds} seeds per task set (0..{args.seeds - 1}), MiniWorld backend")
    print(f"{'task set':<22}{'some object visible':>22}{'target visible':>18}{'s/reset':>10}")
    total_any = total = 0
    for task_set in TASK_SETS:
        env = NavigationEnv(NavigationConfig(task_set=task_set, image_size=args.image_size))
        any_visible = target_visible = 0
        start = time.perf_counter()
        for seed in range(args.seeds):
            gt = env.reset(seed).ground_truth
            any_visible += sees_something(gt)
            target_visible += bool(gt["target"]["visible"])
        per_reset = (time.perf_counter() - start) / args.seeds
        env.close()
        total_any += any_visible
        total += args.seeds
        print(
            f"{task_set:<22}{any_visible:>9}/{args.seeds} = {any_visible / args.seeds:6.1%}"
            f"{target_visible / args.seeds:>18.1%}{per_reset:>10.3f}"
        )
    print(f"{'all':<22}{total_any:>9}/{total} = {total_any / total:6.1%}")


if __name__ == "__main__":
    main()
