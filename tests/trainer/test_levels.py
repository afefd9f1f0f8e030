"""Difficulty-scored levels (ThinkLite-VL): the level file, its filter, the `visenv levels`
command, and a policy's success measured against a real server."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from clients import EnvClient
from trainer.levels import (
    Level,
    RandomPolicy,
    histogram,
    measure_success,
    read_levels,
    select_levels,
    selected_seeds,
    write_levels,
)
from visenv_cli import app

LEVELS = [
    Level("sokoban", 1, oracle_length=3, rollouts=8, successes=8),  # easy
    Level("sokoban", 2, oracle_length=6, rollouts=8, successes=2),  # hard, solvable
    Level("sokoban", 3, oracle_length=9, rollouts=8, successes=0),  # too hard for it
    Level("sokoban", 4, oracle_length=None, rollouts=8, successes=0),  # never solved
    Level("sokoban", 5, oracle_length=5),  # not measured
    Level("frozenlake", 6, oracle_length=4, rollouts=4, successes=1),
]


def test_level_file_round_trips_and_filters(tmp_path):
    path = tmp_path / "levels.jsonl"
    write_levels(path, LEVELS)
    assert read_levels(path) == LEVELS
    chosen = select_levels(read_levels(path), 0.1, 0.7, env="sokoban")
    assert [lv.seed for lv in chosen] == [2]
    assert [lv.seed for lv in select_levels(LEVELS, 0.1, 0.7)] == [2, 6]
    # no filter: every level known to be solvable, measured or not
    assert [lv.seed for lv in select_levels(LEVELS, env="sokoban")] == [1, 2, 3, 5]
    assert selected_seeds(str(path), 0.0, 0.3, "sokoban") == (2, 3)
    with pytest.raises(ValueError, match="no level"):
        selected_seeds(str(path), 0.8, 0.9, "frozenlake")
    with pytest.raises(ValueError):
        select_levels(LEVELS, 0.7, 0.1)
    assert histogram(lv.oracle_length for lv in LEVELS) == {
        "3": 1, "4": 1, "5": 1, "6": 1, "9": 1, "none": 1,
    }  # fmt: skip


@pytest.mark.parametrize(
    "line",
    ['{"env": "sokoban"}', '{"env": "sokoban", "seed": 1.5}', "[1, 2]", "not json",
     '{"env": "sokoban", "seed": 1, "rollouts": 2, "successes": 3}',
     '{"env": "sokoban", "seed": 1, "extra": 0}'],
)  # fmt: skip
def test_a_bad_line_is_named(tmp_path, line):
    path = tmp_path / "levels.jsonl"
    path.write_text(json.dumps(LEVELS[0].to_json()) + "\n" + line + "\n")
    with pytest.raises(ValueError, match=r"levels.jsonl:2"):
        read_levels(path)


def test_levels_command_scores_by_the_oracle(tmp_path):
    out = tmp_path / "levels.jsonl"
    result = CliRunner().invoke(app, ["levels", "sokoban", "--seeds", "0:6", "--out", str(out)])
    assert result.exit_code == 0, result.output
    levels = read_levels(out)
    assert [lv.seed for lv in levels] == list(range(6))
    assert all(lv.oracle_length and lv.oracle_length > 0 and lv.rollouts == 0 for lv in levels)
    assert "all levels" in result.output
    bad = CliRunner().invoke(app, ["levels", "sokoban", "--seeds", "0-6", "--out", str(out)])
    assert bad.exit_code != 0


def test_random_policy_success_is_measured_per_level(visenv_server):
    levels = [Level("sokoban", s) for s in range(3)]
    with EnvClient(visenv_server.grpc) as client:
        spec = next(s for s in client.list_envs() if s.name == "sokoban")
        policy = RandomPolicy(spec.action_space)
        measured = measure_success(
            client.run_episodes, policy, levels, 4, format="no_think", max_turns=3,
            progress=False,
        )  # fmt: skip
        again = measure_success(
            client.run_episodes, policy, levels, 4, format="no_think", max_turns=3,
            progress=False,
        )  # fmt: skip
    assert [(lv.seed, lv.rollouts) for lv in measured] == [(0, 4), (1, 4), (2, 4)]
    assert measured == again  # seeded: the same tries, the same successes
    with pytest.raises(ValueError, match="discrete"):
        RandomPolicy({"kind": "continuous"})
