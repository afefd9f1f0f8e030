"""Benchmark: the trainer's rollouts, episodes per second, against a real `visenv serve`.

FrozenLake 4x4 with natural-sentence observations, 3 turns of at most 3 moves (the
learning demo's set-up), sampled at temperature 1 by a tiny Qwen2.5-VL (by default the
warm-up the learning test uses), one torch thread, all episodes of a round live at once.
Alternates the two ways `HFPolicy` generates: the turn cache (`kv_cache=True`: only each
turn's new tokens computed, the shared system prompt once) and `model.generate` over the
whole conversation every turn. Reports wall-clock episodes/s and the trainer process's
CPU seconds per episode (the fairer figure on a shared machine).

    .venv/bin/python bench/bench_trainer_rollout.py [--episodes 256] [--rounds 2] [--model DIR]
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import torch

from clients import EnvClient
from clients.eval import train_level_seed
from examples.learn_frozenlake import ENV, FORMAT, MAX_TURNS, env_config, start_server
from trainer.model import load_policy
from trainer.rollout import HFPolicy, collect
from trainer.trajectory import ChatLayout

WARM_UP = Path(__file__).resolve().parents[1] / "tests" / "trainer" / "data" / "frozenlake_warmup"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--episodes", type=int, default=256, help="episodes per round")
    ap.add_argument("--rounds", type=int, default=2, help="rounds of each mode, alternating")
    ap.add_argument("--model", default=str(WARM_UP))
    ap.add_argument("--max-new-tokens", type=int, default=12)
    ap.add_argument("--batch-size", type=int, default=64, help="model.generate's batch")
    args = ap.parse_args()
    torch.set_num_threads(1)
    torch.manual_seed(0)
    model, processing = load_policy(args.model)
    model.eval()
    layout = ChatLayout(processing)
    proc, address = start_server()
    results: dict[str, list[dict]] = {"cache": [], "generate": []}
    try:
        client = EnvClient(address)
        seeds = [train_level_seed(0, i) for i in range(args.episodes)]
        for _ in range(args.rounds):
            for mode in results:

                def make_policy(mode=mode):
                    return HFPolicy(model, layout, temperature=1.0,
                                    max_new_tokens=args.max_new_tokens,
                                    batch_size=args.batch_size, kv_cache=mode == "cache")  # fmt: skip

                wall, cpu = time.perf_counter(), time.process_time()
                got = collect(client, make_policy, ENV, seeds, config=env_config("natural"),
                              format=FORMAT, max_turns=MAX_TURNS, progress=False)  # fmt: skip
                wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
                n = len(got.episodes)
                results[mode].append({
                    "episodes": n, "seconds": wall, "episodes_per_second": n / wall,
                    "cpu_seconds_per_episode": cpu / n,
                    "turns_per_episode": sum(e.info["turns"] for e in got.episodes) / n,
                    "success": sum(e.info["success"] for e in got.episodes) / n,
                })  # fmt: skip
                print(mode, json.dumps(results[mode][-1]), flush=True)
        client.close_client()
    finally:
        proc.terminate()
        proc.wait(timeout=30)
    best = {m: max(r["episodes_per_second"] for r in rs) for m, rs in results.items()}
    cpu = {m: min(r["cpu_seconds_per_episode"] for r in rs) for m, rs in results.items()}
    print(json.dumps({"best_episodes_per_second": best, "episodes_per_hour_cache":
                      3600 * best["cache"], "min_cpu_seconds_per_episode": cpu,
                      "cpu_ratio_generate_over_cache": cpu["generate"] / cpu["cache"]}))  # fmt: skip


if __name__ == "__main__":
    main()
