"""Scripted episodes replayed against a recording: the proof that a speed-up changed no
reward, text, ground truth or pixel.

`tests/envs/data/recorded_episodes.json` holds, for scripted Sokoban and FrozenLake
episodes (several configs, tile sizes, formats and representations; well-formed,
malformed, over-long and truthful responses), every reply's reward and its parts, the
world-model scores, the done flags, and digests of the observation text, the ground
truth, the infos, the system prompt and the decoded pixels of every image, as the code
produced them when the recording was made. Each step goes the whole way a served step
goes inside the server: the worker (parsing, the environment, grading, rendering, image
encoding, the reply's plain types) and the service's reward assembly.

Record again only for an intended change of behaviour, and say so in the commit:

    python -m tests.envs.test_recorded_episodes --record
"""

from __future__ import annotations

import argparse
import hashlib
import json
import random
from pathlib import Path
from typing import Any

import pytest

from env_server.core.types import Representation
from env_server.reasoning import ReasoningConfig
from env_server.service.messages import Create, Reset, Step
from env_server.service.models import SessionOptions
from env_server.service.worker import Worker

FIXTURE = Path(__file__).with_name("data") / "recorded_episodes.json"

# (name, env, config, format, representation, image encoding, seeds)
SCRIPTS: list[tuple[str, str, dict[str, Any], str, str, str, list[int]]] = [
    (
        "reference",
        "sokoban",
        {"dim_room": [6, 6], "num_boxes": 1, "tile_size": 16},
        "grounding_worldmodeling",
        "natural",
        "png",
        [0, 1, 2, 3],
    ),  # fmt: skip
    (
        "symbolic",
        "sokoban",
        {"dim_room": [7, 7], "num_boxes": 2, "tile_size": 9},
        "grounding_worldmodeling",
        "symbolic",
        "png",
        [4, 5],
    ),  # fmt: skip
    (
        "structured-raw",
        "sokoban",
        {"dim_room": [6, 8], "num_boxes": 1, "tile_size": 12, "max_turns": 6},
        "worldmodeling",
        "structured",
        "raw",
        [6, 7],
    ),  # fmt: skip
    (
        "grounding",
        "sokoban",
        {"dim_room": [8, 6], "num_boxes": 2, "tile_size": 16},
        "grounding",
        "natural",
        "png",
        [8],
    ),  # fmt: skip
    ("frozenlake", "frozenlake", {}, "grounding_worldmodeling", "natural", "png", [0, 1, 2]),
    (
        "frozenlake-symbolic",
        "frozenlake",
        {},
        "grounding_worldmodeling",
        "symbolic",
        "png",
        [3, 4],
    ),  # fmt: skip
]
TURNS = 8
MOVES = ("Up", "Down", "Left", "Right")


def _digest(value: Any) -> str:
    if not isinstance(value, bytes):
        value = json.dumps(value, sort_keys=True, ensure_ascii=False).encode()
    return hashlib.sha256(value).hexdigest()[:20]


def _record(reply) -> dict[str, Any]:
    obs = reply.observation
    return {
        "reward": reply.reward,
        "reward_parts": reply.reward_parts.to_json(),
        "observation_score": reply.info.get("observation_score"),
        "prediction_score": reply.info.get("prediction_score"),
        "done": [reply.terminated, reply.truncated, reply.success],
        "turn": reply.turn,
        "text": _digest(obs.text),
        "ground_truth": _digest(obs.ground_truth),
        "observation_info": _digest(obs.info),
        # a create's info says how long the process's first instance took: not recorded
        "info": _digest({k: v for k, v in reply.info.items() if k != "warm_up_s"}),
        "system_prompt": _digest(reply.system_prompt or ""),
        "images": [
            [im.encoding, list(im.shape), _digest(im.to_array().tobytes())] for im in obs.images
        ],
    }


def _response(rng: random.Random, worker: Worker, sid: str, fmt: str) -> str:
    """A scripted response: mostly well-formed, with truthful or wrong descriptions, now
    and then an unknown action, too many actions, or a broken layout."""
    session = worker.sessions[sid]
    env, rep = session.env, session.representation
    truth = session.obs.ground_truth
    kind = rng.random()
    moves = [rng.choice(MOVES) for _ in range(rng.randint(1, 3))]
    if kind < 0.08:
        moves.append("Jump")
    elif kind < 0.14:
        moves = moves + ["Up", "Up", "Up"]
    answer = ", ".join(moves)
    if rng.random() < 0.5:
        observation = env.describe(truth, rep)
    else:  # someone else's state, or a grid in a natural session (the benchmark's)
        observation = rng.choice([env.describe(truth, Representation.SYMBOLIC), "I see a room."])
    prediction = env.describe(truth, rep) if rng.random() < 0.5 else "Nothing changes."
    think = {
        "grounding_worldmodeling": f"<observation>{observation}</observation><reasoning>I go."
        f"</reasoning><prediction>{prediction}</prediction>",
        "worldmodeling": f"<reasoning>I go.</reasoning><prediction>{prediction}</prediction>",
        "grounding": f"<observation>{observation}</observation><reasoning>I go.</reasoning>",
    }[fmt]
    text = f"<think>{think}</think><answer>{answer}</answer>"
    if kind > 0.95:
        text = text.replace("</think>", "")  # a broken layout
    return text


def play() -> dict[str, list[dict[str, Any]]]:
    """Every script's episodes: the records of the create, each step and each reset."""
    out: dict[str, list[dict[str, Any]]] = {}
    cfg = ReasoningConfig()
    for name, env, config, fmt, rep, encoding, seeds in SCRIPTS:
        worker = Worker()
        rng = random.Random(name)
        records: list[dict[str, Any]] = []
        for seed in seeds:
            sid = f"{name}-{seed}"
            options = SessionOptions(env=env, config=config, format=fmt, representation=rep,
                                     image_encoding=encoding, seed=seed)  # fmt: skip
            (reply,) = worker.handle([Create(sid, options, cfg)])
            records.append(_record(reply))
            for turn in range(TURNS):
                (stepped,) = worker.handle([Step(sid, _response(rng, worker, sid, fmt))])
                reply = stepped.reply  # finished by the worker
                records.append(_record(reply))
                if reply.done and turn < TURNS - 1:
                    (reply,) = worker.handle([Reset(sid, seed + 100)])
                    records.append(_record(reply))
        out[name] = records
    return out


def _load() -> dict[str, list[dict[str, Any]]]:
    return json.loads(FIXTURE.read_text())


@pytest.fixture(scope="module")
def replayed() -> dict[str, list[dict[str, Any]]]:
    return play()


@pytest.mark.parametrize("script", [s[0] for s in SCRIPTS])
def test_episodes_replay_as_recorded(script: str, replayed) -> None:
    recorded = _load()[script]
    got = replayed[script]
    assert len(got) == len(recorded)
    for n, (want, have) in enumerate(zip(recorded, got, strict=True)):
        for key in want:
            assert have[key] == want[key], f"{script}, record {n}: {key} differs"


def test_the_recording_covers_what_it_claims() -> None:
    """The scripts reach every kind of turn: rewards with and without the format reward,
    non-zero world-model scores, ended episodes and images."""
    records = [r for rs in _load().values() for r in rs]
    parts = [r["reward_parts"] for r in records]
    assert any(p.get("format", 0) > 0 for p in parts)
    assert any(p.get("format", 0) == 0 for p in parts if "env" in p)
    assert any((r["observation_score"] or 0) > 0.99 for r in records)
    assert any(0 < (r["prediction_score"] or 0) < 1 for r in records)
    assert any(r["done"][0] for r in records) and any(r["done"][1] for r in records)
    assert sum(len(r["images"]) for r in records) > 100


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--record", action="store_true", help="write the recording anew")
    if parser.parse_args().record:
        FIXTURE.parent.mkdir(exist_ok=True)
        FIXTURE.write_text(json.dumps(play(), indent=0) + "\n")
        print(f"recorded {sum(len(v) for v in _load().values())} replies in {FIXTURE}")
