"""Evaluate a model served behind an OpenAI-compatible endpoint on a visenv environment
(or a baseline without a model: `visenv eval --policy random|oracle`).

    visenv eval --server 127.0.0.1:50051 --endpoint http://127.0.0.1:8001/v1 \\
        --model Qwen/Qwen2.5-VL-3B-Instruct --env sokoban --episodes 32 --out results.jsonl

Runs the episodes through the SDK (`run_episodes` with the policy), writes them
to an episode file (`clients/episodes.py`: one JSON line per episode, with every turn's
images, response and reward parts; `/play` replays it) and prints a summary.
An episode whose model calls or session failed is counted as failed, with its error; it never counts as a zero-reward episode.
"""

from __future__ import annotations

import asyncio
import sys
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .client import AsyncEnvClient
from .episodes import PARTS, episode_json, write_episodes
from .openai_policy import OpenAIPolicy
from .rollout import Policy, PolicyInput, Trajectory, run_episodes

# Level seeds. A training run with `run.seed` s plays levels s * SEEDS_PER_RUN + i; an
# evaluation with seed s plays EVAL_SEED_BASE + s * SEEDS_PER_RUN + i. With s <= MAX_RUN_SEED
# and i < SEEDS_PER_RUN the two ranges never meet, so `visenv eval --seed 0` is held out
# from a `run.seed=0` training run (VAGEN and RAGEN keep train and validation seeds apart).
SEEDS_PER_RUN = 1_000_000
MAX_RUN_SEED = 999
EVAL_SEED_BASE = (MAX_RUN_SEED + 1) * SEEDS_PER_RUN


def train_level_seed(run_seed: int, index: int) -> int:
    """The level seed of a training run's `index`-th level."""
    if not (0 <= run_seed <= MAX_RUN_SEED and 0 <= index < SEEDS_PER_RUN):
        raise ValueError(
            f"run seed must be 0..{MAX_RUN_SEED} and level index 0..{SEEDS_PER_RUN - 1}"
        )
    return run_seed * SEEDS_PER_RUN + index


def eval_level_seeds(seed: int, episodes: int) -> range:
    """The held-out level seeds of an evaluation: disjoint from every training run's."""
    if not (0 <= seed <= MAX_RUN_SEED and 0 < episodes <= SEEDS_PER_RUN):
        raise ValueError(f"eval seed must be 0..{MAX_RUN_SEED} and episodes 1..{SEEDS_PER_RUN}")
    first = EVAL_SEED_BASE + seed * SEEDS_PER_RUN
    return range(first, first + episodes)


SCORES = ("observation_score", "prediction_score")


def episode_record(traj: Trajectory) -> dict[str, Any]:
    """One episode as a line of an episode file (`clients.episodes`, images included) with
    the evaluation's per-episode scores added."""
    scores = {
        k: [float(t.info[k]) for t in traj.turns if t.info.get(k) is not None] for k in SCORES
    }
    return {
        **episode_json(traj),
        "action_valid_rate": (
            sum(bool(t.info.get("action_valid")) for t in traj.turns) / len(traj.turns)
            if traj.turns
            else None
        ),
        **{k: (sum(v) / len(v) if v else None) for k, v in scores.items()},
    }


@dataclass
class Summary:
    episodes: int
    failed: int
    success_rate: float | None  # over the episodes that finished
    mean_return: float | None
    mean_reward_parts: dict[str, float | None] = field(default_factory=dict)
    action_valid_rate: float | None = None
    observation_score: float | None = None
    prediction_score: float | None = None
    errors: dict[str, int] = field(default_factory=dict)  # error code -> episodes
    # error code -> the first such episode's message (the cause, printed under the table)
    error_messages: dict[str, str] = field(default_factory=dict)


def _mean(xs: Sequence[float | None]) -> float | None:
    vals = [x for x in xs if x is not None]
    return sum(vals) / len(vals) if vals else None


def summarize(records: Sequence[dict[str, Any]]) -> Summary:
    ok = [r for r in records if r["ok"]]
    errors: dict[str, int] = {}
    messages: dict[str, str] = {}
    for r in records:
        if r["error"]:
            code = r["error"]["code"]
            errors[code] = errors.get(code, 0) + 1
            messages.setdefault(code, f"episode {r['episode']} (seed {r['seed']}): "
                                      f"{r['error']['message']}")  # fmt: skip
    return Summary(
        episodes=len(records),
        failed=len(records) - len(ok),
        success_rate=_mean([float(r["success"]) for r in ok]),
        mean_return=_mean([r["return"] for r in ok]),
        mean_reward_parts={k: _mean([r["reward_parts"][k] for r in ok]) for k in PARTS},
        action_valid_rate=_mean([r["action_valid_rate"] for r in ok]),
        observation_score=_mean([r["observation_score"] for r in ok]),
        prediction_score=_mean([r["prediction_score"] for r in ok]),
        errors=errors,
        error_messages=messages,
    )


def print_summary(summary: Summary, title: str) -> None:
    from rich.console import Console
    from rich.table import Table

    def fmt(x: float | None) -> str:
        return "-" if x is None else f"{x:.3f}"

    table = Table(title=title)
    table.add_column("metric")
    table.add_column("value", justify="right")
    table.add_row("episodes", str(summary.episodes))
    table.add_row("failed episodes", str(summary.failed))
    # rates and means are over the episodes that did not fail
    table.add_row("success rate", fmt(summary.success_rate))
    table.add_row("mean return", fmt(summary.mean_return))
    for k, v in summary.mean_reward_parts.items():
        table.add_row(f"mean reward {k}", fmt(v))
    table.add_row("valid-action rate", fmt(summary.action_valid_rate))
    table.add_row("observation score", fmt(summary.observation_score))
    table.add_row("prediction score", fmt(summary.prediction_score))
    for code, n in summary.errors.items():
        table.add_row(f"errors {code}", str(n))
    console = Console(width=100)
    console.print(table)
    for code, message in summary.error_messages.items():
        n = summary.errors[code]
        more = f" (and {n - 1} more episode{'s' * (n > 2)})" if n > 1 else ""
        console.print(f"{code}: {message}{more}", markup=False, highlight=False, soft_wrap=True)


class ProgressLines:
    """A policy that reports progress as lines on stderr (readable in a pipe or a log,
    where a progress bar is not) and hands each batch on to `policy`: an episode seen
    before and missing from a batch has finished."""

    def __init__(self, policy: Policy, env: str, total: int, every_s: float = 5.0) -> None:
        self.policy, self.env, self.total, self.every_s = policy, env, total, every_s
        self.seen: set[int] = set()
        self.reported = -1
        self.last = 0.0

    async def __call__(self, batch: list[PolicyInput]) -> Sequence[Any]:
        import inspect
        import time

        live = {p.episode for p in batch}
        done = len(self.seen - live)
        self.seen |= live
        now = time.monotonic()
        if done != self.reported and now - self.last >= self.every_s:
            self.line(done, len(live), max(p.turn for p in batch))
            self.last = now
        answers = self.policy(batch)
        return await answers if inspect.isawaitable(answers) else answers

    def line(self, done: int, playing: int, turn: int | None = None) -> None:
        self.reported = done
        at = f", turn {turn}" if turn is not None else ""
        print(f"{self.env}: {done}/{self.total} episodes done, {playing} playing{at}",
              file=sys.stderr, flush=True)  # fmt: skip


async def evaluate(
    servers: Sequence[str],
    policy: Policy,
    env: str,
    seeds: Sequence[int],
    *,
    transport: str = "grpc",
    format: str | None = None,
    representation: str | None = None,
    config: dict[str, Any] | None = None,
    max_turns: int | None = None,
    concurrency: int = 16,
    progress: bool | None = None,
) -> list[dict[str, Any]]:
    """Run one episode per seed; returns one record per episode (see episode_record).
    progress: a progress bar on a terminal (None: when stderr is one), else lines."""
    bar = progress if progress is not None else sys.stderr.isatty()
    lines = None if bar else ProgressLines(policy, env, len(seeds))
    async with AsyncEnvClient(list(servers), transport=transport) as client:
        try:
            trajs = await run_episodes(
                client,
                lines or policy,
                env,
                seeds,
                config=config,
                format=format,
                representation=representation,
                max_turns=max_turns,
                concurrency=concurrency,
                on_error="record",
                progress=bar,
            )
        finally:
            if isinstance(policy, OpenAIPolicy):
                await policy.aclose()
    if lines is not None:
        lines.line(len(trajs), 0)
    return [episode_record(t) for t in trajs]


def run_eval(
    servers: Sequence[str],
    policy: Policy,
    env: str,
    seeds: Sequence[int],
    out: str | Path | None = None,
    *,
    name: str | None = None,
    **options: Any,
) -> tuple[list[dict[str, Any]], Summary]:
    """Evaluate, write the JSONL (when `out` is given) and print the summary; `name`
    names the policy in the summary's title."""
    records = asyncio.run(evaluate(servers, policy, env, seeds, **options))
    summary = summarize(records)
    title = name or (policy.model if isinstance(policy, OpenAIPolicy) else "policy")
    print_summary(summary, f"{env}: {title} ({len(records)} episodes)")
    if out is not None:
        written = write_episodes(out, records)
        print(f"wrote {written} episodes to {out}", flush=True)
    return records, summary
