"""Episode files (clients/episodes.py): what is written reads back; foreign lines are refused."""

from __future__ import annotations

import json

import numpy as np
import pytest

from clients.episodes import FORMAT, episode_json, read_episodes, write_episodes
from clients.rollout import Trajectory, Turn
from clients.types import Image, Observation, RewardParts


def _trajectory() -> Trajectory:
    pixels = np.zeros((4, 5, 3), dtype=np.uint8)
    pixels[1, 2] = (255, 0, 0)
    raw = Image("raw", pixels.tobytes(), (4, 5, 3))
    turn = Turn(prompt="SYSTEM\n\nturn text <image>", images=(raw,), ground_truth={"x": 1},
                response="<answer>Left</answer>", reward=0.4,
                reward_parts=RewardParts(env=-0.1, format=0.5), terminated=True,
                truncated=False, success=True, info={"action_valid": True},
                policy_seconds=0.0, step_seconds=0.0)  # fmt: skip
    final = Observation("done <image>", (raw,), {"x": 0})
    return Trajectory(episode=0, env="sokoban", seed=7, system_prompt="SYSTEM", turns=[turn],
                      final_observation=final, terminated=True, success=True)  # fmt: skip


def test_written_episodes_read_back_with_png_images(tmp_path) -> None:
    path = tmp_path / "e.jsonl"
    assert write_episodes(path, [_trajectory()]) == 1
    assert write_episodes(path, [_trajectory()], append=True) == 1
    first, second = read_episodes(path)
    assert first == second and first["format"] == FORMAT
    assert first["turns"] == 1 and first["return"] == pytest.approx(0.4)
    step = first["steps"][0]
    assert step["observation"]["text"] == "turn text <image>"  # the system prompt is its own key
    image = Image.from_json(step["observation"]["images"][0])
    assert image.encoding == "png" and image.to_array()[1, 2].tolist() == [255, 0, 0]
    assert first["final_observation"]["ground_truth"] == {"x": 0}
    assert episode_json(_trajectory(), images=False)["steps"][0]["observation"]["images"] == []


def test_a_line_of_another_format_is_refused_by_line(tmp_path) -> None:
    path = tmp_path / "e.jsonl"
    write_episodes(path, [_trajectory()])
    with path.open("a") as f:
        f.write(json.dumps({"episode": 1}) + "\n")
    with pytest.raises(ValueError, match=r"e.jsonl:2: not a visenv.episode/1 episode"):
        list(read_episodes(path))
