"""bench_transport.py of two checkouts side by side in one run: before, after, before,
after, ... (alternating, so that a busy machine weighs on both alike), then one table of
env-steps/s per variant: the median over rounds of each run's median, the range of the
rounds' after/before ratios, and the server's CPU seconds per 1,000 env-steps (median
over rounds; in-process variants have no server).

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


def run_once(checkout: Path, extra: list[str], retries: int) -> dict[str, dict]:
    """One bench_transport run of `checkout`; a run that fails (on a loaded machine the
    REST one-by-one variant sometimes loses a connection: httpx ReadError) is run again,
    up to `retries` times, and said so."""
    for attempt in range(retries + 1):
        with tempfile.NamedTemporaryFile(suffix=".json") as out:
            done = subprocess.run(
                [sys.executable, "bench/bench_transport.py", "--json", out.name, *extra],
                cwd=checkout, stdout=subprocess.DEVNULL,
            )  # fmt: skip
            if done.returncode == 0:
                rows = json.loads(Path(out.name).read_text())
                return {f"{r['name']} x{r['batch']}": r for r in rows}
        print(f"  the run failed (exit {done.returncode}); attempt {attempt + 2}", flush=True)
    raise SystemExit(f"bench_transport.py of {checkout} failed {retries + 1} times")


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("before", type=Path, help="the other checkout (e.g. a git worktree)")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--json", help="also write the per-round rates here (after each run)")
    parser.add_argument("--retries", type=int, default=2, help="reruns of a run that failed")
    parser.add_argument("--table-of", help="only print the table of a --json file written before")
    args, extra = parser.parse_known_args()
    runs: dict[str, list[dict]] = {"before": [], "after": []}
    if args.table_of:
        runs = json.loads(Path(args.table_of).read_text())["runs"]
        args.rounds = min(len(r) for r in runs.values())  # complete rounds only
        runs = {label: r[: args.rounds] for label, r in runs.items()}
    for n in range(0 if args.table_of else args.rounds):
        for label, checkout in (("before", args.before.resolve()), ("after", ROOT)):
            print(f"round {n + 1}/{args.rounds}: {label} ({checkout})", flush=True)
            runs[label].append(run_once(checkout, extra, args.retries))
            if args.json:  # what has been measured so far survives a later failure
                Path(args.json).write_text(json.dumps({"runs": runs}, indent=1))
    table = Table(title=f"bench_transport.py, {args.rounds} alternating rounds (env-steps/s)")
    columns = ("variant", "before", "after", "after/before", "per round", "server CPU s/1k",
               "CPU after/before", "CPU per round", "API CPU s/1k")  # fmt: skip
    for column in columns:
        table.add_column(column, justify="left" if column == "variant" else "right")
    summary = {}
    for variant in runs["before"][0]:
        if not all(variant in r for rounds in runs.values() for r in rounds):
            continue
        # each run's median trial; the rounds' medians; a round's ratio: after / before
        medians = {
            label: [statistics.median(r[variant]["rates"]) for r in rounds]
            for label, rounds in runs.items()
        }
        rate = {label: statistics.median(m) for label, m in medians.items()}
        ratios = [a / b for a, b in zip(medians["after"], medians["before"], strict=True)]
        # server CPU per 1,000 env-steps: the rounds' median, and each round's after / before
        cpus = {label: [r[variant]["server_cpu"] for r in rounds] for label, rounds in runs.items()}
        cpu = {label: statistics.median(c) for label, c in cpus.items()}
        # of it, the API process's (the rest is the workers')
        api = {
            label: statistics.median(r[variant].get("api_cpu", 0.0) for r in rounds)
            for label, rounds in runs.items()
        }
        served = all(cpus["before"])  # in-process variants have no server
        cpu_ratios = (
            [a / b for a, b in zip(cpus["after"], cpus["before"], strict=True)] if served else []
        )
        summary[variant] = rate | {"ratios": ratios, "server_cpu": cpu, "cpu_ratios": cpu_ratios,
                                   "api_cpu": api}  # fmt: skip
        table.add_row(
            variant, f"{rate['before']:,.0f}", f"{rate['after']:,.0f}",
            f"{rate['after'] / rate['before']:.2f}",
            f"{min(ratios):.2f}-{max(ratios):.2f}",
            f"{cpu['before']:.2f} -> {cpu['after']:.2f}" if served else "-",
            f"{cpu['after'] / cpu['before']:.2f}" if served else "-",
            f"{min(cpu_ratios):.2f}-{max(cpu_ratios):.2f}" if served else "-",
            f"{api['before']:.2f} -> {api['after']:.2f}" if served else "-",
        )  # fmt: skip
    console = Console(width=200)
    console.print(table)
    # issue 44's target: served CPU per env-step at gRPC batch-64 over the in-process step's
    for label, rounds in runs.items():
        ratios = [
            r["gRPC batch (png) x64"]["server_cpu"] / r["in-process (png) x64"]["client_cpu"]
            for r in rounds
            if "gRPC batch (png) x64" in r and "in-process (png) x64" in r
        ]
        if ratios:
            console.print(
                f"{label}: served CPU per env-step at gRPC batch-64 (png) / in-process: "
                + ", ".join(f"{x:.2f}" for x in ratios)
                + f" (median {statistics.median(ratios):.2f})"
            )
    if args.json:
        Path(args.json).write_text(json.dumps({"summary": summary, "runs": runs}, indent=1))


if __name__ == "__main__":
    main()
