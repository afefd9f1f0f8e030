"""`make lint` stands alone: it needs only ruff (no apt, torch or simulators), and the ruff
it installs is the one the dev extra pins, so the formatter's verdict is the same in both."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _target(makefile: str, name: str) -> str:
    match = re.search(rf"^{name}:(.*)$", makefile, re.MULTILINE)
    assert match, f"no `{name}` target in the Makefile"
    return match.group(1).split("##")[0]


def test_lint_needs_no_setup_and_checks_the_format() -> None:
    makefile = (ROOT / "Makefile").read_text()
    prerequisites = _target(makefile, "lint").split()
    assert "setup" not in prerequisites, "make lint must run without the full setup"
    recipe = makefile.split("\nlint:", 1)[1].split("\n\n", 1)[0]
    assert "ruff check ." in recipe and "ruff format --check ." in recipe


def test_lint_ruff_is_the_dev_extras_ruff() -> None:
    makefile = (ROOT / "Makefile").read_text()
    spec = re.search(r"^RUFF_SPEC\s*\?=\s*(\S+)", makefile, re.MULTILINE)
    assert spec, "the Makefile pins ruff in RUFF_SPEC"
    dev = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"][
        "dev"
    ]
    pinned = [d for d in dev if d.replace(" ", "").startswith("ruff")]
    assert pinned == [spec.group(1)], f"dev extra pins {pinned}, the Makefile {spec.group(1)}"
