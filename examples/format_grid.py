"""The format comparison in miniature (issue 46): does the world-model reward help, over seeds?

    # the whole grid, one job at a time at the lowest priority; run it again after an
    # interruption and it goes on (every finished (arm, seed) is skipped)
    nice -n 19 .venv/bin/python examples/format_grid.py --out runs/format-grid
    # the table and the plot of what is finished (also written after every job)
    .venv/bin/python examples/format_grid.py --out runs/format-grid --merge-only \\
        --table docs/experiments/format_grid.md --plot docs/experiments/format_grid.png
    # the pilot: every arm once, a tiny budget, one seed (proves the script, not a result)
    nice -n 19 .venv/bin/python examples/format_grid.py --budget pilot --out runs/format-pilot
    # round two: the same grid under the skeleton guard, every arm from the first
    # grid's warm-up of its seed (so the two grids differ by the guard alone)
    nice -n 19 .venv/bin/python examples/format_grid.py --guard skeleton \\
        --warm-ups runs/format-grid --out runs/format-grid-skeleton --jobs 2
    # the estimators on no_think, round two's way (each in runs/format-grid-estimators/<e>/),
    # then one of them against round two's bi_level, seed by seed
    nice -n 19 .venv/bin/python examples/format_grid.py --guard skeleton \\
        --warm-ups runs/format-grid --arms no_think --estimators gae turn_wise grpo \\
        --out runs/format-grid-estimators --jobs 2
    .venv/bin/python examples/format_grid.py --out runs/format-grid-estimators/gae \\
        --merge-only --compare runs/format-grid-skeleton

Each job is one `examples/learn_frozenlake.py` process: one arm, one training seed, its
warm-up, PPO (bi_level) and the greedy and sampled evaluation of both on the held-out
levels, beside the random, fixed-plan and oracle baselines that script computes. Its
report goes to `<out>/<arm>-<seed>.partial.json` while it runs and is renamed
`<arm>-<seed>.json` when the process has finished with every number; a job with that
file is done. Fixed here, before any PPO number of the grid exists:

- arms (`ARMS`): `no_think`, `free_think`, `grounding_worldmodeling` (world-model reward
  on: 0.5 x observation + 0.5 x prediction score), and `gwm_wm0`: the same layout and
  grading with the world-model weight 0 (the session's `reasoning` option,
  `beta_s = beta_w = 0`, server side). A warm-up is supervised and never sees a reward,
  so `gwm_wm0` starts from the `grounding_worldmodeling` warm-up of its seed (the same
  model its own warm-up would be) and the two differ by the reward alone, paired.
- seeds (`SEEDS`): 0, 1, 2, 3, the same for every arm; every job uses
  `--split-seeds 0 1 2 3`, so all play one shared set of 100 held-out levels.
- the warm-up rule (`WARM_UP_RULE`), one for every arm: every 50 steps (8 episodes of
  the oracle's moves on 1,024 training levels a step, lr 3e-3) play 100 validation levels
  of the seed's training range greedily; stop at the first check whose first move goes
  towards the goal on at least 0.7 of them and whose answers are valid on at least 0.95;
  at most 1,500 steps (the fourth run's rule, under which PPO learnt on 8 of 8 seeds,
  plus the valid-answer condition: a format guard needs a valid format to keep).
- the PPO budget (`BUDGETS["full"]`), the same for every arm: 288 iterations x 32
  episodes, bi_level, lr 1e-3, KL k3 as a loss at 0.1, clip 0.1, StarPO-S half of the
  groups of 4, 2 epochs; the format guard `--invalid-penalty 2` (ppo.invalid_answer_penalty)
  in every arm.

Round two (`--guard skeleton`, fixed 2026-12-06 before any of its numbers existed; the
first grid's guard missed 0.95 on one seed of 16): the same arms, seeds, levels, budget
and penalty, plus constrained decoding of each format's tag skeleton
(`generation.skeleton`, trainer/skeleton.py) in PPO and in every evaluation; each
evaluation also plays greedily without the mask ("unguarded"). Every arm starts from the
first grid's warm-up of its seed (`--warm-ups`), so each (arm, seed) pairs with the
first grid's.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

try:  # run as a script (examples/ is on sys.path) or imported as examples.format_grid
    import learn_frozenlake as lf
except ModuleNotFoundError:
    from examples import learn_frozenlake as lf

SEEDS = (0, 1, 2, 3)
ARMS: dict[str, dict[str, Any]] = {  # flags of each arm; `warm_up_from`: whose warm-up it uses
    "no_think": {"flags": ["--format", "no_think", "--max-new-tokens", "8"]},
    "free_think": {"flags": ["--format", "free_think", "--max-new-tokens", "24"]},
    "grounding_worldmodeling": {
        "flags": ["--format", "grounding_worldmodeling", "--max-new-tokens", "128"]
    },
    "gwm_wm0": {
        "flags": [
            "--format",
            "grounding_worldmodeling",
            "--max-new-tokens",
            "128",
            "--wm-weight",
            "0",
        ],  # fmt: skip
        "warm_up_from": "grounding_worldmodeling",
    },
}
WORLD_MODEL_ARMS = ("grounding_worldmodeling", "gwm_wm0")
PPO_ARM = "bi_level"  # the grid's advantage estimator
# `--estimators`: the same jobs with another estimator (learn_frozenlake's arms), each in
# `<out>/<estimator>/`; `--compare` with the bi_level grid pairs them seed by seed
ESTIMATORS = ("bi_level", "gae", "turn_wise", "grpo")
GUARDS = {  # the format guard, every arm
    "penalty": ["--invalid-penalty", "2"],  # the first grid (2026-12-06)
    "skeleton": ["--invalid-penalty", "2", "--skeleton"],  # round two: tags decoded constrained
    # the mask, with the KL to the warm-up taken without it (the policy keeps its own tags)
    "skeleton_kl": ["--invalid-penalty", "2", "--skeleton", "--kl-unmasked"],
}
GUARD_HOLDS = 0.95  # the bar: greedy valid answers after PPO, on every seed
TASK = ["--variants", "natural", "--max-turns", "6", "--per-turn", "1", "--p", "0.9",
        "--hidden", "64", "--layers", "2", "--warm-up-policy", "oracle", "--no-system-prompt",
        "--demo-levels", "1024", "--eval-levels", "100"]  # fmt: skip
WARM_UP_RULE = ["--validation-levels", "100", "--warmup-check-every", "50",
                "--warmup-stop-toward", "0.7", "--warmup-stop-valid", "0.95",
                "--warmup-steps", "1500", "--warmup-lr", "3e-3"]  # fmt: skip
PPO = ["--episodes", "32", "--group-size", "4", "--actor-lr", "1e-3", "--filter-ratio", "0.5",
       "--kl-coef", "0.1", "--kl-estimator", "k3", "--kl-mode", "loss", "--clip", "0.1",
       "--ppo-epochs", "2"]  # fmt: skip
BUDGETS: dict[str, dict[str, Any]] = {
    "full": {"seeds": SEEDS, "flags": ["--ppo-iterations", "288", "--random-repeats", "3"]},
    # the pilot: the same flags with a warm-up of at most 100 steps (checked at 50 and
    # 100, by the same rule), 4 PPO iterations and one draw of random moves; seed 0 only
    "pilot": {
        "seeds": (0,),
        "flags": ["--ppo-iterations", "4", "--random-repeats", "1", "--warmup-steps", "100"],
    },  # fmt: skip
}


@dataclass
class Job:
    arm: str
    seed: int
    out: Path  # the grid's folder
    guard: str = "penalty"  # an entry of GUARDS
    warm_ups: Path | None = None  # a finished grid whose warm-ups every arm starts from
    estimator: str = PPO_ARM  # an entry of ESTIMATORS

    @property
    def name(self) -> str:
        """`<arm>-<seed>`, under `<estimator>/` for another estimator than the grid's."""
        name = f"{self.arm}-{self.seed}"
        return name if self.estimator == PPO_ARM else f"{self.estimator}/{name}"

    @property
    def result(self) -> Path:
        return self.out / f"{self.name}.json"

    @property
    def after(self) -> Job | None:
        """The job of this grid whose warm-up this one starts from, if any."""
        source = ARMS[self.arm].get("warm_up_from")
        if source is None or self.warm_ups is not None:
            return None
        return Job(source, self.seed, self.out, self.guard, estimator=self.estimator)

    def warm_up(self) -> Path | None:
        """The warm-up this job loads instead of building its own, if any."""
        if self.warm_ups is not None:
            arm = ARMS[self.arm].get("warm_up_from") or self.arm
            return self.warm_ups / f"{arm}-{self.seed}" / f"natural-{self.seed}" / "warm"
        source = self.after  # this grid's job it waits for
        if source is not None:
            return self.out / source.name / f"natural-{self.seed}" / "warm"
        return None

    def command(self, budget: str) -> list[str]:
        b = BUDGETS[budget]
        cmd = [sys.executable, str(Path(lf.__file__)), *TASK, "--probe-arms", self.estimator,
               *WARM_UP_RULE, *PPO,
               *GUARDS[self.guard], "--split-seeds", *map(str, SEEDS), *b["flags"],
               *ARMS[self.arm]["flags"], "--seeds", str(self.seed),
               "--out", str(self.out / self.name),
               "--json", str(self.out / f"{self.name}.partial.json")]  # fmt: skip
        source = self.warm_up()
        if source is not None:
            cmd += ["--warm-up", str(source)]
        return cmd


def jobs(budget: str, out: Path, guard: str = "penalty", warm_ups: Path | None = None,
         arms: Sequence[str] = tuple(ARMS), estimators: Sequence[str] = (PPO_ARM,)) -> list[Job]:  # fmt: skip
    """Seed by seed, every arm (and estimator) of a seed before the next seed: a grid cut
    short holds whole seeds, and a job's warm-up source always comes before it."""
    seeds = BUDGETS[budget]["seeds"]
    found = [Job(arm, seed, out, guard, warm_ups, est)
             for seed in seeds for est in estimators for arm in arms]  # fmt: skip
    missing = [str(w) for j in found if (w := j.warm_up()) is not None and warm_ups is not None
               and not (w / "config.json").exists()]  # fmt: skip
    if missing:
        raise SystemExit(f"--warm-ups: no warm-up at {', '.join(missing)}")
    return found


def finished(report: dict[str, Any], seed: int, estimator: str = PPO_ARM) -> bool:
    runs = report.get("runs", {}).get("natural", {})
    return all(str(seed) in runs.get(arm, {}) for arm in ("warm-up", estimator))


def estimator_of(report: dict[str, Any]) -> str:
    """The estimator a finished report's PPO ran: its one run beside the warm-up."""
    (name,) = (k for k in report["runs"]["natural"] if k != "warm-up")
    return name


def behind(nice: int) -> None:
    """Put a job behind everything else on the machine (in the child, before it runs).
    Linux shares the CPU between sessions' groups (autogroup) before niceness counts
    within a group, so a niced job in the shell's session still takes half the cores
    from a test suite started in another: measured, 2 jobs at nice 19 took 106% of 200%
    beside a pytest run. In a session of its own whose group has the niceness, it gets
    what the others leave."""
    os.setsid()
    os.nice(nice)
    try:
        Path("/proc/self/autogroup").write_text(str(nice))
    except OSError:  # no autogroup (another OS, or the kernel built without it)
        pass


def run_queue(todo: list[Job], budget: str, parallel: int, nice: int) -> list[str]:
    """Run the jobs not done yet, at most `parallel` at once, each after the job it
    depends on; returns the names of those that failed (their dependants are not run)."""
    pending = [j for j in todo if not j.result.exists()]
    print(f"{len(todo) - len(pending)} of {len(todo)} jobs done; {len(pending)} to run", flush=True)
    running: dict[str, tuple[Job, subprocess.Popen, float]] = {}
    failed: list[str] = []

    def stop(*_: Any) -> None:
        for _, proc, _ in running.values():
            proc.send_signal(signal.SIGTERM)  # learn_frozenlake stops its server on the way
        for _, proc, _ in running.values():
            proc.wait(timeout=60)
        sys.exit(143)

    before = {sig: signal.signal(sig, stop) for sig in (signal.SIGTERM, signal.SIGINT)}
    try:
        while pending or running:
            for job in list(pending):
                if len(running) >= parallel:
                    break
                dep = job.after
                if dep is not None and dep.name in failed:
                    pending.remove(job)
                    failed.append(job.name)
                    print(f"{job.name}: not run ({dep.name} failed)", flush=True)
                elif dep is None or dep.result.exists():
                    pending.remove(job)
                    job.result.parent.mkdir(parents=True, exist_ok=True)
                    log = job.out / f"{job.name}.log"
                    with open(log, "w") as f:  # the child keeps its own copy open
                        proc = subprocess.Popen(job.command(budget), stdout=f,
                                                stderr=subprocess.STDOUT,
                                                preexec_fn=lambda: behind(nice))  # fmt: skip
                    running[job.name] = (job, proc, time.time())
                    print(f"{job.name}: started (log {log})", flush=True)
            if not running:  # every pending job waits for one that failed or never ran
                failed += [j.name for j in pending]
                break
            time.sleep(2)
            for name, (job, proc, t0) in list(running.items()):
                if proc.poll() is None:
                    continue
                del running[name]
                partial = job.out / f"{name}.partial.json"
                report = json.loads(partial.read_text()) if partial.exists() else {}
                if proc.returncode == 0 and finished(report, job.seed, job.estimator):
                    partial.rename(job.result)
                    print(f"{name}: done in {time.time() - t0:.0f} s", flush=True)
                    merge(job.result.parent, budget, quiet=True)
                else:
                    failed.append(name)
                    print(f"{name}: failed (exit {proc.returncode}; see its log)", flush=True)
    finally:
        for sig, handler in before.items():
            signal.signal(sig, handler)
    return failed


# ----------------------------------------------------------------------------- the table


def load(out: Path) -> dict[str, dict[int, dict[str, Any]]]:
    """The finished reports, by arm and seed; they must share one held-out set."""
    found: dict[str, dict[int, dict[str, Any]]] = {}
    levels = None
    for arm in ARMS:
        for path in sorted(out.glob(f"{arm}-*.json")):
            seed = path.stem.removeprefix(f"{arm}-")
            if not seed.isdigit():
                continue  # e.g. a .partial.json
            report = json.loads(path.read_text())
            if levels is None:
                levels = report["levels"]
            elif report["levels"] != levels:
                raise SystemExit(f"{path}: played other held-out levels than the rest")
            found.setdefault(arm, {})[int(seed)] = report
    return found


def _interval(values: list[float]) -> dict[str, Any]:
    return lf.over_seeds(values) if values else {}


def arm_summary(by_seed: dict[int, dict[str, Any]]) -> dict[str, Any]:
    """Warm-up and PPO over seeds: greedy and sampled success, the paired gain, valid
    answers (greedy; the lowest seed's too), world-model scores, seconds."""
    seeds = sorted(by_seed)
    runs = [by_seed[s]["runs"]["natural"] for s in seeds]
    warm = [r["warm-up"][str(s)] for r, s in zip(runs, seeds, strict=True)]
    ppo = [r[estimator_of(by_seed[s])][str(s)] for r, s in zip(runs, seeds, strict=True)]

    def of(rows, key, sub=None):
        vals = [(x["eval"][sub] if sub else x["eval"]).get(key) for x in rows]
        return [float(v) for v in vals if v is not None]

    out: dict[str, Any] = {"seeds": seeds}
    for name, rows in (("warm_up", warm), ("ppo", ppo)):
        out[name] = {
            "greedy": _interval(of(rows, "success_rate")),
            "sampled": _interval(of(rows, "success_rate", "sampled")),
            "valid": _interval(of(rows, "valid_answer_rate")),
            "sampled_valid": _interval(of(rows, "valid_answer_rate", "sampled")),
            "first_move_toward_goal": _interval(of(rows, "first_move_toward_goal")),
            "observation_score": _interval(of(rows, "observation_score")),
            "prediction_score": _interval(of(rows, "prediction_score")),
        }
    gains = [p - w for p, w in zip(of(ppo, "success_rate"), of(warm, "success_rate"), strict=True)]
    out["paired_gain"] = _interval(gains)
    # the check the rule stopped at (or the cap); none for a warm-up loaded from another arm
    out["warm_up_steps"] = [w["warmup_validation"][-1]["step"] if w.get("warmup_validation")
                            else None for w in warm]  # fmt: skip
    if all("unguarded" in x["eval"] for x in warm + ppo):  # the skeleton guard's round
        for name, rows in (("warm_up", warm), ("ppo", ppo)):
            out[name]["unguarded_greedy"] = _interval(of(rows, "success_rate", "unguarded"))
            out[name]["unguarded_valid"] = _interval(of(rows, "valid_answer_rate", "unguarded"))
            out[name]["overrode"] = _interval(of(rows, "skeleton_overrode"))
    out["seconds"] = [by_seed[s]["seconds"] for s in seeds]
    out["train_valid"] = [x["train_valid"] for x in ppo]
    out["train_success"] = [x["train_success"] for x in ppo]
    return out


def _cell(stat: dict[str, Any], signed: bool = False) -> str:
    if not stat:
        return ""
    f = "{:+.2f}" if signed else "{:.2f}"
    text = f.format(stat["mean"])
    if "ci95" in stat:
        text += " [" + ", ".join(f.format(v) for v in stat["ci95"]) + "]"
    return text + " (" + ", ".join(f.format(v) for v in stat["per_seed"]) + ")"


def table(grid: dict[str, Any]) -> str:
    b = grid["baselines"]
    n = len(BUDGETS[grid["budget"]]["seeds"])
    lines = [
        f"Held-out success, greedy, on {grid['levels']['held_out']} levels shared by every "
        f"arm: mean [95% CI over seeds] (per seed). Baselines: random moves "
        f"{b['random']['success_rate']:.2f}, best fixed plan {b['fixed_plan']['success_rate']:.2f}, "
        f"oracle {b['oracle']['success_rate']:.2f}.",
        "",
        "| arm | seeds | warm-up stopped at (steps) | warm-up greedy | + PPO greedy | paired gain "
        "| + PPO sampled | greedy valid answers: warm-up → PPO (lowest seed); seeds where the "
        "guard held "
        "| observation score: warm-up → PPO | prediction score: warm-up → PPO | seconds per seed |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for arm, s in grid["arms"].items():
        w, p = s["warm_up"], s["ppo"]
        held = sum(v >= GUARD_HOLDS for v in p["valid"]["per_seed"])
        valid = (f"{w['valid']['mean']:.2f} → {p['valid']['mean']:.2f} "
                 f"({min(p['valid']['per_seed']):.2f}); ≥ {GUARD_HOLDS} on {held} of {len(s['seeds'])}")  # fmt: skip
        scores = [f"{w[k]['mean']:.2f} → {p[k]['mean']:.2f}" if w[k] and p[k] else ""
                  for k in ("observation_score", "prediction_score")]  # fmt: skip
        source = ARMS[arm].get("warm_up_from")
        steps = (f"`{source}`'s" if source else ", ".join(str(x) for x in s["warm_up_steps"])
                 if any(x is not None for x in s["warm_up_steps"]) else "given (`--warm-ups`)")  # fmt: skip
        lines.append(
            f"| `{arm}` | {len(s['seeds'])} of {n} | {steps} | {_cell(w['greedy'])} "
            f"| {_cell(p['greedy'])} | {_cell(s['paired_gain'], signed=True)} "
            f"| {_cell(p['sampled'])} | {valid} | {scores[0]} | {scores[1]} "
            f"| {', '.join(f'{x:.0f}' for x in s['seconds'])} |"
        )
    guarded = {arm: s for arm, s in grid["arms"].items() if "overrode" in s["ppo"]}
    if guarded:
        lines += [
            "",
            "Under the skeleton guard, what the policy writes without it (greedy, the same "
            "levels) and how often the mask changed a greedy answer: warm-up → PPO.",
            "",
            "| arm | unguarded greedy success | unguarded greedy valid answers "
            "| greedy turns the mask changed |",
            "|---|---|---|---|",
        ]
        for arm, s in guarded.items():
            w, p = s["warm_up"], s["ppo"]
            lines.append(" | ".join([f"| `{arm}`"] + [
                f"{w[k]['mean']:.2f} → {_cell(p[k])}"
                for k in ("unguarded_greedy", "unguarded_valid", "overrode")]) + " |")  # fmt: skip
    effect = grid.get("world_model_reward")
    if effect:
        lines += [
            "",
            f"The world-model reward, paired by seed (`{WORLD_MODEL_ARMS[0]}` − `{WORLD_MODEL_ARMS[1]}`, "
            f"the same warm-ups; seeds {', '.join(map(str, effect['seeds']))}): + PPO greedy success "
            f"{_cell(effect['greedy'], signed=True)}; sampled {_cell(effect['sampled'], signed=True)}; "
            f"observation score {_cell(effect['observation_score'], signed=True)}; prediction score "
            f"{_cell(effect['prediction_score'], signed=True)}.",
        ]  # fmt: skip
    return "\n".join(lines) + "\n"


def paired(a: dict[int, dict[str, Any]], b: dict[int, dict[str, Any]],
           what: list[tuple[str, str, str, str | None]]) -> dict[str, Any] | None:  # fmt: skip
    """`a`'s reports minus `b`'s, seed by seed on the seeds both finished, for each
    (name, phase, key, sub) of `what`: the evaluation's `key` (under `sub`) after `phase`
    ("warm-up", or "ppo": each report's own estimator)."""
    seeds = sorted(set(a) & set(b))
    if not seeds:
        return None

    def value(report: dict[str, Any], seed: int, phase: str, key: str, sub: str | None) -> float:
        phase = estimator_of(report) if phase == "ppo" else phase
        ev = report["runs"]["natural"][phase][str(seed)]["eval"]
        return float((ev[sub] if sub else ev)[key])

    out: dict[str, Any] = {"seeds": seeds}
    for name, *at in what:
        out[name] = _interval([value(a[s], s, *at) - value(b[s], s, *at) for s in seeds])
    return out


def world_model_reward(found: dict[str, dict[int, dict[str, Any]]]) -> dict[str, Any] | None:
    """The reward's effect alone: after PPO, the arm with it minus the arm without, seed by
    seed (both start from the same warm-up), where both have finished."""
    on, off = (found.get(arm, {}) for arm in WORLD_MODEL_ARMS)
    return paired(on, off, [("greedy", "ppo", "success_rate", None),
                            ("sampled", "ppo", "success_rate", "sampled"),
                            ("observation_score", "ppo", "observation_score", None),
                            ("prediction_score", "ppo", "prediction_score", None)])  # fmt: skip


def paired_with(found: dict[str, dict[int, dict[str, Any]]],
                before: dict[str, dict[int, dict[str, Any]]]) -> dict[str, Any]:  # fmt: skip
    """This grid minus another on the same warm-ups (round two minus the first grid: the
    guard's effect), arm by arm and seed by seed, where both have finished: PPO greedy
    success and valid answers, and the warm-up's greedy success (the same model decoded
    two ways: what the guard changes at evaluation alone)."""
    what = [("ppo_greedy", "ppo", "success_rate", None),
            ("ppo_valid", "ppo", "valid_answer_rate", None),
            ("warm_up_greedy", "warm-up", "success_rate", None)]  # fmt: skip
    rows = {arm: paired(found.get(arm, {}), before.get(arm, {}), what) for arm in ARMS}
    return {arm: row for arm, row in rows.items() if row is not None}


def compare_table(effect: dict[str, Any], other: Path) -> str:
    lines = [
        "",
        f"Against `{other}` (the same warm-ups), seed by seed: this grid minus that one.",
        "",
        "| arm | seeds | + PPO greedy success | + PPO greedy valid answers "
        "| warm-up greedy success (decoding alone) |",
        "|---|---|---|---|---|",
    ]
    for arm, row in effect.items():
        cells = [_cell(row[k], signed=True) for k in ("ppo_greedy", "ppo_valid", "warm_up_greedy")]
        lines.append(
            f"| `{arm}` | {', '.join(map(str, row['seeds']))} | " + " | ".join(cells) + " |"
        )
    return "\n".join(lines) + "\n"


def plot(grid: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (bars, valid) = plt.subplots(1, 2, figsize=(13, 4.5), width_ratios=[3, 2])
    arms = list(grid["arms"])
    for i, arm in enumerate(arms):
        for dx, key, color in ((-0.2, "warm_up", "tab:grey"), (0.2, "ppo", "tab:green")):
            stat = grid["arms"][arm][key]["greedy"]
            lo, hi = stat.get("ci95", [stat["mean"]] * 2)
            bars.bar(i + dx, stat["mean"], 0.38, yerr=[[stat["mean"] - lo], [hi - stat["mean"]]],
                     color=color, capsize=3, label=key.replace("_", "-") if i == 0 else None)  # fmt: skip
            bars.plot([i + dx] * len(stat["per_seed"]), stat["per_seed"], "k.", markersize=4)
    for name, style in (("random", ":"), ("fixed_plan", "--"), ("oracle", "-.")):
        bars.axhline(grid["baselines"][name]["success_rate"], color="k", ls=style, lw=1,
                     label=name.replace("_", " "))  # fmt: skip
    bars.set_xticks(range(len(arms)), arms, fontsize=8)
    bars.set_ylabel("held-out success (greedy)")
    bars.set_title("warm-up and + PPO: mean, 95% CI over seeds, dots: seeds", fontsize=9)
    bars.legend(fontsize=7)
    for arm in arms:
        series = np.array(grid["arms"][arm]["train_valid"], dtype=float)
        valid.plot(series.mean(0), label=arm)
    valid.set_xlabel("PPO iteration")
    valid.set_ylabel("valid answers (sampled, training), mean over seeds")
    valid.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)


def merge(out: Path, budget: str, table_path: Path | None = None,
          plot_path: Path | None = None, quiet: bool = False,
          compare: Path | None = None) -> dict[str, Any] | None:  # fmt: skip
    """The grid's table (`<out>/grid.md`), numbers (`<out>/grid.json`) and plot
    (`<out>/grid.png`) from the finished jobs; also to `table_path` and `plot_path`.
    `compare`: another grid on the same warm-ups and levels, paired seed by seed."""
    found = load(out)
    if not found:
        print("no finished job yet", flush=True)
        return None
    first = next(iter(next(iter(found.values())).values()))
    grid = {"budget": budget, "levels": first["levels"], "baselines": first["baselines"],
            "arms": {arm: arm_summary(by_seed) for arm, by_seed in found.items()},
            "world_model_reward": world_model_reward(found)}  # fmt: skip
    text = table(grid)
    if compare is not None:
        before = load(compare)
        if before and next(iter(next(iter(before.values())).values()))["levels"] != grid["levels"]:
            raise SystemExit(f"--compare {compare}: played other held-out levels")
        grid["compared"] = {"with": str(compare), "arms": paired_with(found, before)}
        text += compare_table(grid["compared"]["arms"], compare)
    (out / "grid.json").write_text(json.dumps(grid, indent=1))
    for path in (out / "grid.md", table_path):
        if path is not None:
            path.write_text(text)
    for path in (out / "grid.png", plot_path):
        if path is not None:
            plot(grid, path)
    if not quiet:
        print(text)
    return grid


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=Path("runs/format-grid"))
    ap.add_argument("--budget", choices=list(BUDGETS), default="full")
    ap.add_argument("--guard", choices=list(GUARDS), default="penalty",
                    help="the format guard of every arm: penalty (the first grid), skeleton "
                    "(round two: plus constrained decoding of the tags), skeleton_kl (the "
                    "same, with the KL to the warm-up taken without the mask)")  # fmt: skip
    ap.add_argument("--warm-ups", type=Path, default=None,
                    help="a finished grid: every arm starts from its warm-up of the seed "
                    "(gwm_wm0 from grounding_worldmodeling's) instead of building one")  # fmt: skip
    ap.add_argument("--jobs", type=int, default=1,
                    help="processes at once (each holds one core: on 2 cores shared with a "
                    "test suite, 1)")  # fmt: skip
    ap.add_argument("--nice", type=int, default=19, help="the jobs' niceness")
    ap.add_argument("--merge-only", action="store_true", help="only write the table and plot")
    ap.add_argument("--table", type=Path, default=None, help="also write the table here")
    ap.add_argument("--plot", type=Path, default=None, help="also write the plot here")
    ap.add_argument("--arms", nargs="+", choices=list(ARMS), default=list(ARMS),
                    help="the arms to run (default all)")  # fmt: skip
    ap.add_argument("--estimators", nargs="+", choices=ESTIMATORS, default=[PPO_ARM],
                    help="advantage estimators (default bi_level, the grid's); another's jobs "
                    "go to <out>/<estimator>/, merged there")  # fmt: skip
    ap.add_argument("--compare", type=Path, default=None,
                    help="another grid on the same warm-ups (round two: the first grid): "
                    "its numbers subtracted seed by seed")  # fmt: skip
    args = ap.parse_args()
    if len(args.estimators) > 1 and (args.table or args.plot):
        ap.error("--table and --plot take one estimator's grid: merge each with --merge-only")
    failed: list[str] = []
    if not args.merge_only:
        todo = jobs(args.budget, args.out, args.guard, args.warm_ups, args.arms, args.estimators)
        failed = run_queue(todo, args.budget, args.jobs, args.nice)
    for est in args.estimators:
        out = args.out if est == PPO_ARM else args.out / est
        merge(out, args.budget, args.table, args.plot, compare=args.compare)
    if failed:
        raise SystemExit(f"failed: {', '.join(failed)}")


if __name__ == "__main__":
    main()
