"""examples/format_grid.py: the queue's order, dependencies and resume, and the merge's
arithmetic (paired gains, intervals over seeds, the lowest seed's valid answers)."""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

import pytest

from examples import format_grid as fg


def test_every_arm_of_a_seed_runs_before_the_next_seed(tmp_path):
    names = [j.name for j in fg.jobs("full", tmp_path)]
    assert names[:4] == [f"{arm}-0" for arm in fg.ARMS]
    assert len(names) == len(fg.ARMS) * len(fg.SEEDS) and len(fg.SEEDS) >= 4
    for i, job in enumerate(fg.jobs("full", tmp_path)):  # a warm-up source comes first
        if job.after is not None:
            assert job.after.name in names[:i]


def test_arms_share_the_seeds_rule_budget_and_held_out_split(tmp_path):
    commands = {j.arm: j.command("full") for j in fg.jobs("full", tmp_path) if j.seed == 1}
    common = [*fg.TASK, "--probe-arms", "bi_level", *fg.WARM_UP_RULE, *fg.PPO, *fg.GUARDS["penalty"], "--split-seeds", "0", "1", "2", "3",
              *fg.BUDGETS["full"]["flags"]]  # fmt: skip
    for cmd in commands.values():
        assert cmd[2 : 2 + len(common)] == common
        assert cmd[cmd.index("--seeds") + 1] == "1"
    wm0 = commands["gwm_wm0"]
    assert wm0[wm0.index("--wm-weight") + 1] == "0"  # the reward off, the layout kept
    assert wm0[wm0.index("--warm-up") + 1] == str(
        tmp_path / "grounding_worldmodeling-1" / "natural-1" / "warm"
    )
    assert "--wm-weight" not in commands["grounding_worldmodeling"]


def test_round_two_differs_by_the_guard_alone(tmp_path):
    """--guard skeleton --warm-ups: every flag of the first grid plus --skeleton, and every
    arm (each seed) loads the first grid's warm-up, so no job waits for another."""
    first = tmp_path / "first"
    for arm in ("no_think", "free_think", "grounding_worldmodeling"):
        for seed in fg.SEEDS:
            (first / f"{arm}-{seed}" / f"natural-{seed}" / "warm").mkdir(parents=True)
            (first / f"{arm}-{seed}" / f"natural-{seed}" / "warm" / "config.json").write_text("{}")
    again = fg.jobs("full", tmp_path / "second", "skeleton", first)
    plain = {j.name: j.command("full") for j in fg.jobs("full", tmp_path / "second")}
    for job in again:
        assert job.after is None
        cmd = job.command("full")
        assert cmd.count("--skeleton") == 1 and cmd.count("--invalid-penalty") == 1
        source = "grounding_worldmodeling" if job.arm == "gwm_wm0" else job.arm
        warm = first / f"{source}-{job.seed}" / f"natural-{job.seed}" / "warm"
        assert cmd[cmd.index("--warm-up") + 1] == str(warm)

        def bare(c):
            return [x for x in c if x not in ("--skeleton", "--warm-up") and not x.endswith("warm")]

        assert bare(cmd) == bare(plain[job.name])
    (first / "no_think-2" / "natural-2" / "warm" / "config.json").unlink()
    with pytest.raises(SystemExit, match="no_think-2"):
        fg.jobs("full", tmp_path / "second", "skeleton", first)


@pytest.mark.parametrize("guard", list(fg.GUARDS))
def test_every_guards_jobs_parse_in_learn_frozenlake(tmp_path, guard):
    """A job's command line is learn_frozenlake's own (a flag it lacks would fail the job
    only when the queue reaches it, hours in)."""
    from examples import learn_frozenlake as lf

    for job in fg.jobs("full", tmp_path, guard):
        args = lf.parser().parse_args(job.command("full")[2:])
        assert args.skeleton == ("--skeleton" in fg.GUARDS[guard])
        assert args.kl_unmasked == ("--kl-unmasked" in fg.GUARDS[guard])


def test_the_estimators_differ_from_the_grid_by_the_estimator_alone(tmp_path):
    """--estimators: each job is the grid's job with another estimator, named apart (the
    queue tells jobs by name) and written to <out>/<estimator>/, seed by seed."""
    from examples import learn_frozenlake as lf

    grid = {j.name: j.command("full") for j in fg.jobs("full", tmp_path, "skeleton")}
    others = fg.jobs("full", tmp_path, "skeleton", arms=["no_think"], estimators=["gae", "grpo"])
    assert [j.name for j in others[:4]] == ["gae/no_think-0", "grpo/no_think-0", "gae/no_think-1",
                                            "grpo/no_think-1"]  # fmt: skip
    assert len({j.name for j in others}) == len(others) == 2 * len(fg.SEEDS)
    for job in others:
        cmd = job.command("full")
        assert lf.parser().parse_args(cmd[2:]).probe_arms == [job.estimator]
        assert job.result == tmp_path / job.estimator / f"no_think-{job.seed}.json"
        assert cmd[cmd.index("--json") + 1] == str(
            tmp_path / job.estimator / f"no_think-{job.seed}.partial.json"
        )
        plain = grid[f"no_think-{job.seed}"]
        differ = [(a, b) for a, b in zip(cmd, plain, strict=True) if a != b]
        assert differ == [(job.estimator, "bi_level"),
                          *[(str(p), str(p).replace(f"/{job.estimator}/", "/")) for p in (
                              tmp_path / job.estimator / f"no_think-{job.seed}",
                              tmp_path / job.estimator / f"no_think-{job.seed}.partial.json")]]  # fmt: skip


def test_an_estimators_grid_merges_against_the_bi_level_one(tmp_path):
    """A report of another estimator is read by its own run (not bi_level's), and
    --compare pairs it with the grid's bi_level seed by seed."""
    levels = {"held_out": 100, "held_out_first": 7}
    first, gae = tmp_path, tmp_path / "gae"
    gae.mkdir()
    for seed, (bi, other) in {0: (0.3, 0.5), 1: (0.4, 0.3)}.items():
        (first / f"no_think-{seed}.json").write_text(
            json.dumps(_report(seed, 0.2, bi, 1.0, levels))
        )
        report = _report(seed, 0.2, other, 1.0, levels)
        report["runs"]["natural"]["gae"] = report["runs"]["natural"].pop("bi_level")
        (gae / f"no_think-{seed}.json").write_text(json.dumps(report))
    grid = fg.merge(gae, "full", quiet=True, compare=first)
    assert grid["arms"]["no_think"]["ppo"]["greedy"]["per_seed"] == pytest.approx([0.5, 0.3])
    assert grid["compared"]["arms"]["no_think"]["ppo_greedy"]["per_seed"] == pytest.approx(
        [0.2, -0.1]
    )
    assert fg.finished(report, 1, "gae") and not fg.finished(report, 1)


def test_finished_jobs_are_skipped(tmp_path, capsys):
    todo = fg.jobs("pilot", tmp_path)
    for job in todo:
        job.result.write_text("{}")
    assert fg.run_queue(todo, "pilot", parallel=1, nice=19) == []
    assert "4 of 4 jobs done; 0 to run" in capsys.readouterr().out
    assert not list(tmp_path.glob("*.log"))  # nothing was started


def test_jobs_run_behind_the_rest_of_the_machine(tmp_path, monkeypatch):
    """A job runs niced, in a session of its own whose scheduling group is niced too
    (where the kernel groups sessions), so a test suite elsewhere keeps its share."""
    probe = ("import os; print('nice', os.nice(0)); print('own session', os.getsid(0) == os.getpid());"
             "p = '/proc/self/autogroup'; print(open(p).read() if os.path.exists(p) else 'no autogroup')")  # fmt: skip
    monkeypatch.setattr(fg.Job, "command", lambda self, budget: [sys.executable, "-c", probe])
    (job,) = fg.jobs("pilot", tmp_path)[:1]
    assert fg.run_queue([job], "pilot", parallel=1, nice=19) == [job.name]  # no report: failed
    log = (tmp_path / f"{job.name}.log").read_text()
    assert "nice 19" in log and "own session True" in log
    if Path("/proc/self/autogroup").exists():
        assert re.search(r"/autogroup-\d+ nice 19", log), log


def test_a_job_never_starts_before_its_warm_up_exists(tmp_path):
    source, dependant = fg.jobs("pilot", tmp_path)[2:4]
    assert dependant.after == source
    # the source has no result (failed, or not queued): the dependant is reported, not run
    assert fg.run_queue([dependant], "pilot", parallel=1, nice=19) == [dependant.name]


def _report(seed, warm, ppo, valid, levels):
    def ev(success, valid_rate, scores):
        return {"success_rate": success, "valid_answer_rate": valid_rate,
                "first_move_toward_goal": 0.5, "sampled": {"success_rate": success,
                "valid_answer_rate": valid_rate}, **scores}  # fmt: skip

    scores = {"observation_score": 0.5, "prediction_score": 0.4}
    return {
        "levels": levels, "seconds": 100.0 + seed,
        "baselines": {k: {"success_rate": v} for k, v in
                      (("random", 0.2), ("fixed_plan", 0.25), ("oracle", 1.0))},
        "runs": {"natural": {
            "warm-up": {str(seed): {"eval": ev(warm, 1.0, scores),
                                    "warmup_validation": [{"step": 50}, {"step": 100 + seed}]}},
            "bi_level": {str(seed): {"eval": ev(ppo, valid, scores), "train_valid": [1.0, valid],
                                     "train_success": [0.1, 0.2]}},
        }},
    }  # fmt: skip


def test_merge_pairs_each_seed_with_its_own_warm_up(tmp_path):
    levels = {"held_out": 100, "held_out_first": 7}
    cases = {0: (0.2, 0.5, 0.99), 1: (0.4, 0.5, 0.96), 2: (0.1, 0.4, 0.98), 3: (0.3, 0.5, 0.99)}
    for seed, (warm, ppo, valid) in cases.items():
        report = _report(seed, warm, ppo, valid, levels)
        (tmp_path / f"no_think-{seed}.json").write_text(json.dumps(report))
    (tmp_path / "no_think-4.partial.json").write_text("{}")  # a job still running: left out
    grid = fg.merge(tmp_path, "full", plot_path=tmp_path / "p.png", quiet=True)
    s = grid["arms"]["no_think"]
    assert s["seeds"] == [0, 1, 2, 3]
    assert s["paired_gain"]["per_seed"] == pytest.approx([0.3, 0.1, 0.3, 0.2])
    assert s["paired_gain"]["mean"] == pytest.approx(0.225)
    half = 3.182 * 0.0957427 / 2  # t(3) x sample std / sqrt(4)
    assert s["paired_gain"]["ci95"] == pytest.approx([0.225 - half, 0.225 + half], abs=1e-4)
    assert s["warm_up_steps"] == [100, 101, 102, 103]
    text = (tmp_path / "grid.md").read_text()
    assert "| `no_think` | 4 of 4 | 100, 101, 102, 103 |" in text
    assert "1.00 → 0.98 (0.96); ≥ 0.95 on 4 of 4" in text  # valid answers, the lowest seed
    assert grid["world_model_reward"] is None  # no world-model arm yet
    assert (tmp_path / "p.png").stat().st_size > 0

    other = _report(0, 0.2, 0.5, 1.0, {"held_out": 100, "held_out_first": 8})
    (tmp_path / "free_think-0.json").write_text(json.dumps(other))
    with pytest.raises(SystemExit, match="other held-out levels"):
        fg.merge(tmp_path, "full", quiet=True)


def test_merge_pairs_the_world_model_arms_seed_by_seed(tmp_path):
    """The reward's effect: the arm with it minus the arm without, on the seeds both have."""
    levels = {"held_out": 100, "held_out_first": 7}
    for seed, (on, off) in {0: (0.5, 0.3), 1: (0.4, 0.45), 2: (0.6, 0.5)}.items():
        for arm, ppo in (("grounding_worldmodeling", on), ("gwm_wm0", off)):
            report = _report(seed, 0.3, ppo, 0.9 if seed == 1 else 0.97, levels)
            (tmp_path / f"{arm}-{seed}.json").write_text(json.dumps(report))
    (tmp_path / "gwm_wm0-2.json").unlink()  # seed 2 without the reward not finished
    grid = fg.merge(tmp_path, "full", quiet=True)
    effect = grid["world_model_reward"]
    assert effect["seeds"] == [0, 1]
    assert effect["greedy"]["per_seed"] == pytest.approx([0.2, -0.05])
    text = (tmp_path / "grid.md").read_text()
    assert "+ PPO greedy success +0.08 [-1.51, +1.66] (+0.20, -0.05)" in text
    assert "≥ 0.95 on 2 of 3" in text and "≥ 0.95 on 1 of 2" in text  # seed 1: 0.90


def test_compare_pairs_two_grids_seed_by_seed(tmp_path):
    """--compare: this grid minus another on the same warm-ups, per arm and seed, on the
    seeds both finished; other held-out levels are refused."""
    levels = {"held_out": 100, "held_out_first": 7}
    first, second = tmp_path / "first", tmp_path / "second"
    first.mkdir(), second.mkdir()
    for seed, (before, after) in {0: (0.3, 0.4), 1: (0.5, 0.45), 2: (0.2, 0.2)}.items():
        (first / f"gwm_wm0-{seed}.json").write_text(
            json.dumps(_report(seed, 0.3, before, 0.94, levels))
        )
        if seed < 2:
            (second / f"gwm_wm0-{seed}.json").write_text(
                json.dumps(_report(seed, 0.3, after, 1.0, levels))
            )
    grid = fg.merge(second, "full", quiet=True, compare=first)
    row = grid["compared"]["arms"]["gwm_wm0"]
    assert row["seeds"] == [0, 1]
    assert row["ppo_greedy"]["per_seed"] == pytest.approx([0.1, -0.05])
    assert row["ppo_valid"]["per_seed"] == pytest.approx([0.06, 0.06])
    assert row["warm_up_greedy"]["per_seed"] == pytest.approx([0.0, 0.0])
    assert "| `gwm_wm0` | 0, 1 | +0.03" in (second / "grid.md").read_text()
    other = _report(0, 0.3, 0.4, 1.0, {"held_out": 100, "held_out_first": 8})
    (second / "gwm_wm0-0.json").write_text(json.dumps(other))
    (second / "gwm_wm0-1.json").unlink()
    with pytest.raises(SystemExit, match="other held-out levels"):
        fg.merge(second, "full", quiet=True, compare=first)
