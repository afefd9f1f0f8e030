"""FrozenLake: seeded maps, rules, rewards, gymnasium images, text views and the oracle."""

from __future__ import annotations

import json

import numpy as np
import pytest
from pydantic import ValidationError

from env_server.core import Action, EnvError, Representation, ResponseFormat, registry
from env_server.envs.frozenlake import FrozenLakeEnv
from env_server.envs.frozenlake.env import generate_map


def acts(*names: str) -> list[Action]:
    return [Action(n) for n in names]


def test_registry_builds_it():
    env = registry.make("frozenlake", {"size": 4})
    assert isinstance(env, FrozenLakeEnv)
    assert env.action_space.names == ("Left", "Down", "Right", "Up")
    assert env.action_space.max_per_turn == 3


def test_same_seed_same_map_images_and_rewards():
    runs = []
    for _ in range(2):
        env = FrozenLakeEnv()
        obs = env.reset(seed=11)
        record = [obs.ground_truth, obs.images[0].tobytes()]
        while True:
            tr = env.step(env.oracle_actions())
            record += [tr.reward, tr.observation.ground_truth, tr.observation.images[0].tobytes()]
            if tr.done:
                break
        runs.append(record)
        env.close()
    assert runs[0] == runs[1]
    maps = {json.dumps(FrozenLakeEnv().reset(seed=s).ground_truth["holes"]) for s in range(10)}
    assert len(maps) > 3, "different seeds should give different maps"


def test_oracle_solves_100_seeds():
    env = FrozenLakeEnv()
    for seed in range(100):
        env.reset(seed)
        total = 0.0
        while True:
            tr = env.step(env.oracle_actions())
            total += tr.reward
            if tr.done:
                break
        assert tr.success and tr.terminated and not tr.truncated, f"seed {seed} not solved"
        assert total == 10.0
        assert tr.observation.ground_truth["player"] == tr.observation.ground_truth["goal"]
    env.close()


def test_goal_reward_is_the_configured_one():
    env = FrozenLakeEnv(FrozenLakeEnv.Config(success_reward=3.5, max_actions_per_turn=10))
    env.reset(2)  # __O_ / ____ / ____ / __PG
    tr = env.step(acts("Left", "Left", "Up", "Right", "Right", "Right", "Down", "Left"))
    assert tr.reward == 3.5 and tr.success and tr.terminated
    assert tr.actions_executed == 7 and tr.info["skipped_actions"] == ["Left"]
    assert tr.info["actions"][-1] == {
        "name": "Down",
        "result": "moved",
        "reward": 3.5,
        "event": "reached the goal",
    }
    assert env.describe(tr.observation.ground_truth, "symbolic").split("\n")[-1] == "___√"


def test_hole_ends_the_episode_without_reward():
    env = FrozenLakeEnv()
    env.reset(0)  # _G__ / OO__ / _OO_ / OP__
    tr = env.step(acts("Right", "Up", "Up"))
    assert tr.terminated and not tr.success and not tr.truncated
    assert tr.reward == 0.0
    assert tr.actions_executed == 2 and tr.info["skipped_actions"] == ["Up"]
    assert tr.info["actions"][1]["event"] == "fell into a hole"
    assert tr.observation.ground_truth["player"] == [2, 2]
    assert env.describe(tr.observation.ground_truth, "symbolic").split("\n")[2] == "_OX_"
    assert env.oracle_actions() == []
    with pytest.raises(EnvError) as err:
        env.step(acts("Up"))
    assert err.value.code == "FAILED_PRECONDITION"


def test_edge_bump_is_blocked_and_empty_turns_truncate():
    env = FrozenLakeEnv(FrozenLakeEnv.Config(max_turns=2))
    env.reset(3)  # __O_ / P___ / ___G / ___O
    tr = env.step(acts("Left", "Left", "Fly"))
    assert [a["result"] for a in tr.info["actions"]] == ["blocked", "blocked"]
    assert tr.invalid_actions and tr.invalid_actions[0].startswith("Fly: unknown action")
    assert tr.observation.ground_truth["player"] == [1, 0] and not tr.done
    assert tr.observation.info == {"turn": 1, "max_turns": 2}
    tr = env.step([])
    assert tr.truncated and not tr.terminated and tr.actions_executed == 0
    with pytest.raises(EnvError) as err:
        env.step([])
    assert err.value.code == "FAILED_PRECONDITION"


def test_start_and_goal_are_random_and_every_level_is_solvable():
    # gymnasium's generator always starts at [0, 0] and ends at the far corner; ours
    # draws both, so no blind plan solves many levels; the oracle proves each solvable
    starts, goals = set(), set()
    for size in (3, 4, 6):
        env = FrozenLakeEnv(FrozenLakeEnv.Config(size=size, max_turns=size * size))
        for seed in range(150):
            gt = env.reset(seed).ground_truth
            assert gt["player"] != gt["goal"] and gt["player"] not in gt["holes"]
            starts.add((size, *gt["player"]))
            goals.add((size, *gt["goal"]))
            while True:
                tr = env.step(env.oracle_actions())
                if tr.done:
                    break
            assert tr.success, f"size {size} seed {seed} not solved by the oracle"
        env.close()
    assert (
        len({s for s in starts if s[0] == 4}) == 16 and len({g for g in goals if g[0] == 4}) == 16
    )
    assert generate_map(5, 0.7, 42) == generate_map(5, 0.7, 42)
    assert all(isinstance(row, str) for row in generate_map(5, 0.7, 42))


def test_text_render_mode_writes_the_map_in_the_observation():
    env = FrozenLakeEnv(FrozenLakeEnv.Config(render_mode="text"))
    obs = env.reset(1)
    assert obs.images == [] and "<image>" not in obs.text
    assert obs.text.endswith("____\n_GP_\n___O\n____")
    moved = env.step(acts("Left")).observation
    assert moved.text.endswith("____\n_√__\n___O\n____")
    prompt = env.system_prompt(ResponseFormat.NO_THINK)
    assert "as text" in prompt and "The image shows" not in prompt


def test_text_as_natural_and_structured_write_the_same_state():
    natural = FrozenLakeEnv(FrozenLakeEnv.Config(render_mode="text", text_as="natural"))
    structured = FrozenLakeEnv(FrozenLakeEnv.Config(render_mode="text", text_as="structured"))
    a, b = natural.reset(1), structured.reset(1)
    assert "The goal is in the same row, to the left of the player." in a.text
    assert a.images == []
    assert json.loads(b.text.split("\n", 1)[1]) == {"player": [1, 2], "goal": [1, 1],
                                                     "hole": [[2, 3]]}  # fmt: skip
    assert "one sentence per object" in natural.system_prompt(ResponseFormat.NO_THINK)
    with pytest.raises(ValidationError):
        FrozenLakeEnv.Config(text_as="grid")


def test_describe_three_representations_for_a_known_seed():
    env = FrozenLakeEnv()
    gt = env.reset(1).ground_truth
    assert gt["grid_size"] == [4, 4] and gt["goal"] == [1, 1]
    assert json.loads(env.describe(gt, Representation.STRUCTURED)) == {
        "player": [1, 2],
        "goal": [1, 1],
        "hole": [[2, 3]],
    }
    assert env.describe(gt, Representation.SYMBOLIC) == "____\n_GP_\n___O\n____"
    assert env.describe(gt, Representation.NATURAL) == (
        "The goal is in the same row, to the left of the player. "
        "The hole is below and to the right of the player."
    )
    gt = env.step(acts("Down", "Down", "Right")).observation.ground_truth
    assert env.describe(gt, Representation.NATURAL) == (
        "The goal is above and to the left of the player. "
        "The hole is in the same column, above the player."
    )
    assert {tuple(r["position"]): r["vertical"] for r in gt["relations"]}[(1, 1)] == "above"
    with pytest.raises(EnvError):
        env.describe({"goal": [3, 3]}, Representation.NATURAL)


def test_symbolic_view_agrees_with_grading_symbols():
    env = FrozenLakeEnv(FrozenLakeEnv.Config(size=6))
    for seed in range(5):
        env.reset(seed)
        env.step(env.oracle_actions())
        state = env.ground_truth()
        found: dict[str, list] = {"player": [], "goal": [], "hole": []}
        for r, row in enumerate(env.describe(state, Representation.SYMBOLIC).split("\n")):
            for c, symbol in enumerate(row):
                for kind in FrozenLakeEnv.grading.symbols[symbol]:
                    found[kind].append([r, c])
        structured = json.loads(env.describe(state, Representation.STRUCTURED))
        assert found == {
            "player": [structured["player"]],
            "goal": [structured["goal"]],
            "hole": structured["hole"],
        }


def test_observation_images_and_resize():
    env = FrozenLakeEnv()
    obs = env.reset(0)
    assert obs.text.count("<image>") == 1
    assert obs.images[0].shape == (256, 256, 3) and obs.images[0].dtype == np.uint8
    moved = env.step(acts("Right")).observation.images[0]
    assert not np.array_equal(moved, obs.images[0]), "the player's move must show in the image"
    small = FrozenLakeEnv(FrozenLakeEnv.Config(image_size=128))
    image = small.reset(0).images[0]
    assert image.shape == (128, 128, 3) and image.dtype == np.uint8
    big = FrozenLakeEnv(FrozenLakeEnv.Config(size=6)).reset(0).images[0]
    assert big.shape == (384, 384, 3)
    for e in (env, small):
        e.close()
        e.close()  # safe twice


def test_system_prompt_names_actions_symbols_and_limit():
    text = FrozenLakeEnv().system_prompt(ResponseFormat.FREE_THINK)
    for word in ("Left, Down, Right, Up", "up to 3 action", "hole", "goal", "√", "+10"):
        assert word in text
