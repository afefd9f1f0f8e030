"""bench_transport.py of two checkouts side by side in one run: before, after, before,
after, ... (alternating, so that a busy machine weighs on both alike), then one table of
env-steps/s per variant: the median over rounds of each run's median.

    git worktree add ../visenv-before <commit>
    python bench/compare_transport.py ../visenv-before --rounds 2 --json compare.json

Each run starts its own server from its own checkout (`bench/bench_transport.py` there).
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from rich.console import Console
from rich.table import Table

ROOT = Path(__file__).resolve().parents[1]


def run_once(checkout: Path, extra: list[str]) -> dict[str, dict]:
    with tempfile.NamedTemporaryFile(suffix=".json") as out:
        subprocess.run(
            [sys.executable, "bench/bench_transport.py", "--json", out.name, *extra],
            cwd=checkout, check=True, stdout=subprocess.DEVNULL,
        )  # fmt: skip
        rows = json.loads(Path(out.name).read_text())
    return {f"{r['name']} x{r['batch']}": r for r in rows}


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("before", type=Path, help="the other checkout (e.g. a git worktree)")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--json", help="also write the per-round rates here")
    args, extra = parser.parse_known_args()
    runs: dict[str, list[dict]] = {"before": [], "after": []}
    for n in range(args.rounds):
        for label, checkout in (("before", args.before.resolve()), ("after", ROOT)):
            print(f"round {n + 1}/{args.rounds}: {label} ({checkout})", flush=True)
            runs[label].append(run_once(checkout, extra))
    table = Table(title=f"bench_transport.py, {args.rounds} alternating rounds (env-steps/s)")
    for column in ("variant", "before", "after", "after/before"):
        table.add_column(column, justify="left" if column == "variant" else "right")
    summary = {}
    for variant in runs["before"][0]:
        rate = {
            label: statistics.median(statistics.median(r[variant]["rates"]) for r in rounds)
            for label, rounds in runs.items()
            if all(variant in r for r in rounds)
        }
        if len(rate) < 2:
            continue
        summary[variant] = rate
        table.add_row(
            variant, f"{rate['before']:,.0f}", f"{rate['after']:,.0f}",
            f"{rate['after'] / rate['before']:.2f}",
        )  # fmt: skip
    Console().print(table)
    if args.json:
        Path(args.json).write_text(json.dumps({"summary": summary, "runs": runs}, indent=1))


if __name__ == "__main__":
    main()
