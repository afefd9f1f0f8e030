"""Episode files: whole episodes, images included, one JSON object per line.

    from clients.episodes import write_episodes, read_episodes
    write_episodes("episodes.jsonl", trajectories)             # run_episodes' Trajectory list
    write_episodes("samples.jsonl", trajectories, append=True)  # e.g. each training step's
    for episode in read_episodes("episodes.jsonl"): ...

`visenv eval --out` writes this format, the trainer writes its sampled episodes in it,
and the play page (`/play`, "open episode file") steps through such a file with the same
timeline as a live session, so one shared file lets anyone see what an agent did.

One line is one episode (format `visenv.episode/1`):

    {"format": "visenv.episode/1", "env": "sokoban", "seed": 7, "episode": 0, "group": 0,
     "session_id": "...", "system_prompt": "...",
     "ok": true, "error": null | {"code", "message"},
     "success": true, "return": 1.3 | null (a failed episode has none), "terminated": true,
     "truncated": false, "reward_parts": {"env", "format", "observation", "prediction",
     "penalty"} (summed over the turns),
     "turns": 2 (how many turns it took),
     "steps": [{"turn": 0,
                "observation": {"text", "images": [IMAGE, ...], "ground_truth": {...}},
                "response": "<answer>Left</answer>", "reward": -0.1,
                "reward_parts": {...}, "terminated": false, "truncated": false,
                "success": false, "info": {...step info: action_valid, actions, parse_error,
                observation_score, prediction_score, ...}}, ...],
     "final_observation": {"text", "images", "ground_truth"} | null}

A turn's observation is what the agent was shown before it answered; `final_observation`
is what the last step showed. IMAGE is `{"encoding": "png", "data": BASE64, "shape": [h, w,
3]}` (wire.Image's JSON; raw images are written as PNG so that a browser shows them; JPEG
stays JPEG); `images=False` leaves the images out (`"images": []`, text and rewards only).
Other keys may be added to a line (`visenv eval` adds its per-episode scores); readers
ignore keys they do not know.
"""

from __future__ import annotations

import io
import json
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

from .rollout import Trajectory, _strip_system
from .types import Image, Observation, RewardParts

FORMAT = "visenv.episode/1"
PARTS = tuple(RewardParts().to_json())


def image_json(image: Image) -> dict[str, Any]:
    """An image as the file holds it: PNG or JPEG, base64 (raw bytes are encoded as PNG)."""
    if image.encoding == "raw":
        buf = io.BytesIO()
        image.to_pil().save(buf, format="PNG")
        image = Image("png", buf.getvalue(), image.shape)
    return image.to_json()


def observation_json(obs: Observation, images: bool = True) -> dict[str, Any]:
    return {
        "text": obs.text,
        "images": [image_json(im) for im in obs.images] if images else [],
        "ground_truth": obs.ground_truth,
    }


def episode_json(traj: Trajectory, images: bool = True) -> dict[str, Any]:
    """One episode as one JSON-ready object in the format above."""
    steps = []
    for i, t in enumerate(traj.turns):
        text = _strip_system(t.prompt, traj.system_prompt)  # the prompt is in its own key
        shown = Observation(text, t.images, t.ground_truth)
        steps.append(
            {
                "turn": i,
                "observation": observation_json(shown, images),
                "response": t.response,
                "reward": t.reward,
                "reward_parts": t.reward_parts.to_json(),
                "terminated": t.terminated,
                "truncated": t.truncated,
                "success": t.success,
                "info": t.info,
            }
        )
    final = traj.final_observation
    return {
        "format": FORMAT,
        "env": traj.env,
        "seed": traj.seed,
        "episode": traj.episode,
        "group": traj.group,
        "session_id": traj.session_id,
        "system_prompt": traj.system_prompt,
        "ok": traj.ok,
        "error": None
        if traj.error is None
        else {"code": traj.error.code, "message": traj.error.message},
        "success": traj.success,
        "return": traj.total_reward if traj.ok else None,
        "terminated": traj.terminated,
        "truncated": traj.truncated,
        "reward_parts": {k: sum(t.reward_parts.to_json()[k] for t in traj.turns) for k in PARTS},
        "turns": len(steps),
        "steps": steps,
        "final_observation": None if final is None else observation_json(final, images),
    }


def write_episodes(
    path: str | Path,
    episodes: Iterable[Trajectory | dict[str, Any]],
    *,
    append: bool = False,
    images: bool = True,
) -> int:
    """Write episodes (Trajectory objects, or lines made by `episode_json`) to `path`, one
    line each; `append` adds to an existing file. Returns the number written."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    written = 0
    with path.open("a" if append else "w", encoding="utf-8") as f:
        for ep in episodes:
            line = ep if isinstance(ep, dict) else episode_json(ep, images)
            f.write(json.dumps(line, ensure_ascii=False) + "\n")
            written += 1
    return written


def read_episodes(path: str | Path) -> Iterator[dict[str, Any]]:
    """The episodes of a file, as dicts; ValueError (naming the line) for a line that is
    not an episode of this format."""
    with Path(path).open(encoding="utf-8") as f:
        for number, text in enumerate(f, 1):
            if not text.strip():
                continue
            try:
                line = json.loads(text)
            except json.JSONDecodeError as exc:
                raise ValueError(f"{path}:{number}: not JSON: {exc}") from None
            if not isinstance(line, dict) or line.get("format") != FORMAT:
                raise ValueError(f"{path}:{number}: not a {FORMAT} episode")
            yield line
