"""Levels chosen by measured difficulty (ThinkLite-VL): the level file, its filter, and a
policy's success over K tries.

ThinkLite-VL trains on the samples that are hard but solvable for the model being trained.
Here a level's difficulty is measured two ways, and a level file holds both, one JSON
object per line:

    {"env": "sokoban", "seed": 3, "oracle_length": 7, "rollouts": 8, "successes": 3}

- `oracle_length`: how many actions the environment's own expert (BFS for Sokoban) needs
  from the start to success (null when it found none within the turn limit);
- `rollouts` / `successes`: a policy's K tries at the level (0 / 0 when none was measured;
  tries that failed for a server error are not counted, never scored as wrong).

`visenv levels ENV --seeds A:B --out levels.jsonl` writes the file; the trainer reads it
with `ppo.level_file` and trains on the levels whose success rate lies in
[`ppo.level_success_min`, `ppo.level_success_max`] (e.g. 0.1 .. 0.7).
"""

from __future__ import annotations

import functools
import json
from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any


@dataclass(frozen=True)
class Level:
    env: str
    seed: int
    oracle_length: int | None = None
    rollouts: int = 0
    successes: int = 0

    @property
    def success(self) -> float | None:
        """The policy's success rate over its tries; None when not measured."""
        return self.successes / self.rollouts if self.rollouts else None

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, data: Any) -> Level:
        if not isinstance(data, dict):
            raise ValueError("a level must be a JSON object")
        unknown = set(data) - {"env", "seed", "oracle_length", "rollouts", "successes"}
        if unknown:
            raise ValueError(f"unknown keys {sorted(unknown)}")
        length = data.get("oracle_length")
        level = cls(
            env=str(data["env"]),
            seed=_int(data["seed"], "seed"),
            oracle_length=None if length is None else _int(length, "oracle_length"),
            rollouts=_int(data.get("rollouts", 0), "rollouts"),
            successes=_int(data.get("successes", 0), "successes"),
        )
        if not 0 <= level.successes <= level.rollouts:
            raise ValueError("successes must be between 0 and rollouts")
        return level


def _int(value: Any, name: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError(f"{name} must be an integer, got {value!r}")
    return value


def write_levels(path: str | Path, levels: Iterable[Level]) -> None:
    with Path(path).open("w") as f:
        for level in levels:
            f.write(json.dumps(level.to_json()) + "\n")


def read_levels(path: str | Path) -> list[Level]:
    """The levels of a level file; a bad line raises ValueError naming it."""
    levels = []
    for n, line in enumerate(Path(path).read_text().splitlines(), 1):
        if not line.strip():
            continue
        try:
            levels.append(Level.from_json(json.loads(line)))
        except (ValueError, KeyError) as exc:  # json.JSONDecodeError is a ValueError
            raise ValueError(f"{path}:{n}: not a level: {exc}") from None
    return levels


def select_levels(
    levels: Sequence[Level],
    success_min: float = 0.0,
    success_max: float = 1.0,
    env: str | None = None,
) -> list[Level]:
    """The levels (of `env`, if given) whose policy success rate is within
    [success_min, success_max]. Only a filter of [0, 1] keeps levels without a measured
    rate; the oracle must have solved a level for it to be kept (solvable)."""
    if not 0 <= success_min <= success_max <= 1:
        raise ValueError("need 0 <= success_min <= success_max <= 1")
    unfiltered = success_min == 0 and success_max == 1
    out = []
    for level in levels:
        if env is not None and level.env != env:
            continue
        rate = level.success
        if rate is None and not unfiltered:
            continue
        if rate is not None and not success_min <= rate <= success_max:
            continue
        if level.oracle_length is None and not (rate is not None and rate > 0):
            continue  # nobody solved it: not known to be solvable
        out.append(level)
    return out


@functools.lru_cache(maxsize=8)
def selected_seeds(
    path: str, success_min: float, success_max: float, env: str | None = None
) -> tuple[int, ...]:
    """The seeds of a level file's selected levels (read once per path and filter)."""
    chosen = select_levels(read_levels(path), success_min, success_max, env)
    if not chosen:
        raise ValueError(
            f"{path}: no level of {env or 'any env'} has a success rate within "
            f"[{success_min}, {success_max}] (and is solvable)"
        )
    return tuple(level.seed for level in chosen)


def measure_success(
    run_episodes: Callable[..., list[Any]],
    policy: Any,
    levels: Sequence[Level],
    tries: int,
    **episode_options: Any,
) -> list[Level]:
    """Each level with its policy's success over `tries` episodes from one start (one
    session per level, forked: `run_episodes(..., group_size=tries)`). `run_episodes`
    is a client's (sync) run_episodes; episodes that failed for an error don't count."""
    if not levels:
        return []
    env = levels[0].env
    trajs = run_episodes(
        policy, env, [lv.seed for lv in levels], group_size=tries, on_error="record",
        **episode_options,
    )  # fmt: skip
    counted: Counter[int] = Counter()
    solved: Counter[int] = Counter()
    for traj in trajs:
        if traj.ok:
            counted[traj.group] += 1
            solved[traj.group] += bool(traj.success)
    return [
        Level(lv.env, lv.seed, lv.oracle_length, lv.rollouts + counted[g], lv.successes + solved[g])
        for g, lv in enumerate(levels)
    ]


def histogram(values: Iterable[int | None]) -> dict[str, int]:
    """Counts per value, in order ("none" last: no oracle solution)."""
    counts = Counter("none" if v is None else int(v) for v in values)
    numbers = sorted(k for k in counts if k != "none")
    out = {str(k): counts[k] for k in numbers}
    if "none" in counts:
        out["none"] = counts["none"]
    return out


def format_histograms(columns: dict[str, dict[str, int]]) -> str:
    """Side-by-side text histograms (fractions of each column's total), one row per value."""
    keys = sorted({k for c in columns.values() for k in c}, key=lambda k: (k == "none", k.zfill(6)))
    totals = {name: max(1, sum(c.values())) for name, c in columns.items()}
    rows = ["value  " + "  ".join(f"{name:>18}" for name in columns)]
    for key in keys:
        cells = []
        for name, counts in columns.items():
            share = counts.get(key, 0) / totals[name]
            cells.append(f"{counts.get(key, 0):5d} {share:5.2f} {'#' * round(share * 6):6}")
        rows.append(f"{key:>5}  " + "  ".join(cells))
    return "\n".join(rows)


class RandomPolicy:
    """Uniformly random moves in the `no_think` format, seeded per (level, try, turn): a
    baseline that measures difficulty without a model (`visenv levels --policy random`)."""

    def __init__(self, action_space: dict[str, Any], seed: int = 0) -> None:
        if action_space.get("kind") != "discrete" or not action_space.get("names"):
            raise ValueError("the random policy needs an environment with discrete actions")
        self.names = list(action_space["names"])
        self.per_turn = int(action_space.get("max_per_turn") or 1)
        self.seed = seed

    def __call__(self, batch: list[Any]) -> list[str]:
        import random

        out = []
        for p in batch:
            rng = random.Random(f"{self.seed}/{p.seed}/{p.episode}/{p.turn}")
            moves = [rng.choice(self.names) for _ in range(rng.randint(1, self.per_turn))]
            out.append(f"<answer>{', '.join(moves)}</answer>")
        return out
