"""Where vicrit's items come from: our own scenes, or a user's JSONL file.

- `generate(...)`: a level of a ground-truth environment (sokoban, frozenlake) at a
  seed, its caption and one injected error (see `caption.py`), verified before use.
- `jsonl_rows(path)`: a file of `{"image", "caption", "span", "category", "original"?}`
  objects, one per line, under the operator's `$VISENV_DATA_DIR` (the same rules as svg's
  user data: `env_server/envs/svg/data.py:user_data_path`). `image` is a path relative
  to the JSONL file's folder, also inside the data folder; `span` must occur exactly once
  in `caption` (after normalisation); `original` (optional) is the true wording.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Any

import numpy as np
from PIL import Image, UnidentifiedImageError

from env_server.core import EnvError

from . import caption as cap

# how many scenes one seed may draw before no unambiguous error of its category is found
SCENE_TRIES = 20


@dataclass(frozen=True)
class Item:
    """One episode's task: an image, a caption with one wrong span, and where it came from."""

    image: np.ndarray | None  # None when not rendered (statistics, tests)
    caption: str
    span: str
    category: cap.Category
    original: str | None  # the true words (None when a JSONL row does not say)
    source: str  # "sokoban", "frozenlake" or "jsonl"
    source_seed: int | None  # the level of the source environment
    row: int | None = None  # the JSONL line
    clean: str | None = None  # the caption before the error was injected


GOLDEN = (5**0.5 - 1) / 2


def draw_category(
    seed: int,
    rng: np.random.Generator,
    weights: dict[str, float],
    balance: str = "stratified",
    present: set[str] | None = None,
) -> cap.Category:
    """The category of `seed`, in proportion to the weights (among those `present`).

    stratified: from the point seed * 0.618... (mod 1) of a golden-ratio (Weyl) sequence,
    which spreads consecutive seeds evenly, so any run of N seeds holds each category
    within a couple of episodes of its share; random: an independent draw from `rng`.
    """
    names = [
        c for c in cap.CATEGORIES if weights.get(c, 0.0) > 0 and (present is None or c in present)
    ]
    if not names:
        raise EnvError(
            "category_weights gives no weight to any category the data holds",
            code="INVALID_ARGUMENT",
        )
    p = np.array([weights[c] for c in names], dtype=float)
    p /= p.sum()
    if balance == "random":
        return names[int(rng.choice(len(names), p=p))]
    u = (seed * GOLDEN) % 1.0
    return names[min(int(np.searchsorted(np.cumsum(p), u, side="right")), len(names) - 1)]


def source_env(source: str, render: bool):
    """A fresh source environment (imported on use). FrozenLake in text mode when no image
    is needed, so that making a caption draws nothing."""
    if source == "sokoban":
        from env_server.envs.sokoban import SokobanEnv

        return SokobanEnv()
    if source == "frozenlake":
        from env_server.envs.frozenlake import FrozenLakeEnv
        from env_server.envs.frozenlake.env import FrozenLakeConfig

        return FrozenLakeEnv(FrozenLakeConfig(render_mode="vision" if render else "text"))
    raise EnvError(f"unknown vicrit source {source!r}; use sokoban or frozenlake")


def scene(source: str, seed: int, render: bool) -> tuple[cap.Scene, np.ndarray | None]:
    """The source environment's level at `seed`: its scene and (if `render`) its image."""
    env = source_env(source, render)
    try:
        obs = env.reset(seed)
        made = cap.make_scene(source, env, obs.ground_truth, seed)
        return made, (obs.images[0] if render and obs.images else None)
    finally:
        env.close()


def generate(
    seed: int,
    sources: list[str],
    weights: dict[str, float],
    *,
    balance: str = "stratified",
    render: bool = True,
    check: bool = True,
) -> tuple[Item, cap.Scene]:
    """The item of `seed` and its scene: category and source drawn from the seed, the
    source's level `seed` (another level drawn from the seed in the rare case that it
    allows no unambiguous error of that category), the caption and one error, both checked
    by `verify` (unless `check` is False: a caller that verifies them itself)."""
    rng = np.random.default_rng(seed)
    category = draw_category(seed, rng, weights, balance)
    source = sources[int(rng.integers(len(sources)))]
    source_seed = seed
    for _ in range(SCENE_TRIES):
        made, image = scene(source, source_seed, render)
        sentences = cap.WRITERS[source](made)
        corruption = cap.choose(sentences, category, rng)
        if corruption is not None:
            break
        source_seed = int(rng.integers(2**31))
    else:
        raise EnvError(
            f"seed {seed}: no {source} level in {SCENE_TRIES} tries allows an unambiguous "
            f"{category} error",
            code="INTERNAL",
        )
    clean = cap.text_of(sentences)
    text = cap.text_of(cap.apply(sentences, corruption))
    if check:
        cap.verify(made, clean)
        cap.verify(
            made, text, span=corruption.span, category=category, original=corruption.original
        )
    item = Item(
        image=image,
        caption=text,
        span=corruption.span,
        category=category,
        original=corruption.original,
        source=source,
        source_seed=source_seed,
        clean=clean,
    )
    return item, made


# ---- a user's JSONL file ---------------------------------------------------------------


@dataclass(frozen=True)
class Row:
    line: int
    image: Path
    caption: str
    span: str
    category: cap.Category
    original: str | None


def _user_path(name: str, field: str) -> Path:
    """svg's rule for files named in a session's config: inside $VISENV_DATA_DIR only."""
    try:
        from env_server.envs.svg.data import user_data_path
    except ImportError as exc:  # svg's extra is missing: its package can't be imported
        raise EnvError(
            f"{field}: reading user data needs the svg package's path rules ({exc}); "
            "pip install 'visenv[svg]'",
            code="UNAVAILABLE",
        ) from exc
    return user_data_path(name, field)


def jsonl_rows(jsonl_path: str) -> tuple[Row, ...]:
    path = _user_path(jsonl_path, "jsonl_path")
    if not path.is_file():
        raise EnvError(f"jsonl_path {jsonl_path!r} is not a file", code="INVALID_ARGUMENT")
    folder = PurePosixPath(jsonl_path).parent
    rows = []
    with path.open(encoding="utf-8") as lines:
        for number, line in enumerate(lines, start=1):
            if line.strip():
                rows.append(_row(json_row(line, jsonl_path, number), jsonl_path, folder, number))
    if not rows:
        raise EnvError(f"jsonl_path {jsonl_path!r} holds no items", code="INVALID_ARGUMENT")
    return tuple(rows)


def json_row(line: str, jsonl_path: str, number: int) -> dict[str, Any]:
    try:
        row = json.loads(line)
    except ValueError as exc:
        raise EnvError(f"{jsonl_path}:{number}: not JSON ({exc})") from exc
    if not isinstance(row, dict):
        raise EnvError(f"{jsonl_path}:{number}: expected a JSON object")
    return row


def _row(row: dict[str, Any], jsonl_path: str, folder: PurePosixPath, number: int) -> Row:
    where = f"{jsonl_path}:{number}"
    for key in ("image", "caption", "span", "category"):
        if not isinstance(row.get(key), str) or not row[key].strip():
            raise EnvError(f"{where}: {key!r} must be a non-empty string")
    if row["category"] not in cap.CATEGORIES:
        raise EnvError(
            f"{where}: category {row['category']!r} is not one of {', '.join(cap.CATEGORIES)}"
        )
    original = row.get("original")
    if original is not None and not isinstance(original, str):
        raise EnvError(f"{where}: 'original' must be a string")
    found = cap.occurrences(row["span"], row["caption"])
    if found != 1:
        raise EnvError(
            f"{where}: the span {row['span']!r} occurs {found} times in the caption; "
            "it must occur exactly once (case, punctuation and spaces aside)"
        )
    image = _user_path(str(folder / row["image"]), "image")
    if not image.is_file():
        raise EnvError(f"{where}: image {row['image']!r} is not a file")
    return Row(number, image, row["caption"], row["span"], row["category"], original)


def load_image(row: Row, jsonl_path: str) -> np.ndarray:
    try:
        with Image.open(row.image) as img:
            return np.asarray(img.convert("RGB"))
    except (OSError, UnidentifiedImageError) as exc:
        raise EnvError(f"{jsonl_path}:{row.line}: image cannot be read ({exc})") from exc


def pick_row(
    rows: tuple[Row, ...], seed: int, weights: dict[str, float], balance: str = "stratified"
) -> Row:
    """The row of `seed`: a category drawn with the weights, then a row of it."""
    rng = np.random.default_rng(seed)
    category = draw_category(seed, rng, weights, balance, {r.category for r in rows})
    chosen = [r for r in rows if r.category == category]
    return chosen[int(rng.integers(len(chosen)))]
