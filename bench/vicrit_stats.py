"""Statistics of the vicrit environment over many seeds (numbers, not pass/fail).

    .venv/bin/python bench/vicrit_stats.py [--seeds 1000] [--first 0]

Prints, for the default config (sokoban and frozenlake scenes, equal category weights):
- the category balance (stratified by default) and the source mix, and how many seeds had
  to draw another level;
- caption length in words (the ViCrit paper's captions are about 200 words) and span
  length in words;
- the oracle's success (answering the true span; must be 100%);
- two random-span baselines, played through the environment: a random run of 1 to 6
  consecutive caption words, and a random run of exactly the true span's length (a
  baseline told how long the span is);
- the time per episode (reset with rendering + one step).
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections import Counter

import numpy as np

from env_server.core import Action
from env_server.envs.vicrit import VicritEnv
from env_server.envs.vicrit import caption as cap


def random_run(words: list[str], length: int, rng: np.random.Generator) -> str:
    length = min(length, len(words))
    start = int(rng.integers(len(words) - length + 1))
    return " ".join(words[start : start + length])


def share(n: int, total: int) -> str:
    return f"{n:5d}  ({100 * n / total:5.1f}%)"


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--seeds", type=int, default=1000, help="episodes (seeds) to draw")
    parser.add_argument("--first", type=int, default=0, help="first seed")
    args = parser.parse_args()

    env = VicritEnv()
    rng = np.random.default_rng(12345)
    categories: Counter[str] = Counter()
    sources: Counter[str] = Counter()
    caption_words: dict[str, list[int]] = {}
    span_words: list[int] = []
    wins = Counter()
    seconds = 0.0
    redrawn = 0  # seeds whose own level allowed no unambiguous error of the drawn category
    for seed in range(args.first, args.first + args.seeds):
        start = time.perf_counter()
        env.reset(seed)
        truth = env.ground_truth()
        snapshot = env.snapshot()
        tr = env.step(env.oracle_actions())
        seconds += time.perf_counter() - start
        wins["oracle"] += tr.success
        words = truth["caption"].split()
        span_len = len(truth["span"].split())
        for name, answer in (
            ("random 1-6 words", random_run(words, int(rng.integers(1, 7)), rng)),
            ("random, true length", random_run(words, span_len, rng)),
        ):
            env.restore(snapshot)
            wins[name] += env.step([Action("span", payload=answer)]).success
        categories[truth["category"]] += 1
        sources[truth["source"]] += 1
        redrawn += truth["source_seed"] != seed
        caption_words.setdefault(truth["source"], []).append(len(words))
        span_words.append(span_len)

    n = args.seeds
    print(f"vicrit, default config, seeds {args.first}..{args.first + n - 1}")
    print("category balance:")
    for c in cap.CATEGORIES:
        print(f"  {c:<10} {share(categories[c], n)}")
    print("sources:")
    for s, count in sorted(sources.items()):
        print(f"  {s:<10} {share(count, n)}")
    print(f"levels redrawn (no unambiguous error of the category): {redrawn}")
    print("caption length (words):")
    for s, lengths in sorted(caption_words.items()):
        print(
            f"  {s:<10} mean {statistics.mean(lengths):6.1f}  median "
            f"{statistics.median(lengths):5.0f}  min {min(lengths):4d}  max {max(lengths):4d}"
        )
    everything = [w for lengths in caption_words.values() for w in lengths]
    print(f"  {'all':<10} mean {statistics.mean(everything):6.1f}")
    print(f"span length (words): mean {statistics.mean(span_words):.2f}, max {max(span_words)}")
    print("success (exact match):")
    for name in ("oracle", "random 1-6 words", "random, true length"):
        print(f"  {name:<22} {share(wins[name], n)}")
    print(f"time per episode (reset with image + oracle step): {1000 * seconds / n:.1f} ms")


if __name__ == "__main__":
    main()
