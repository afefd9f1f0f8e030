"""`visenv train --help` names the example configs, and each one it names exists."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_train_help_names_the_example_configs() -> None:
    proc = subprocess.run([sys.executable, "-m", "visenv_cli", "train", "--help"], cwd=ROOT,
                          capture_output=True, text=True, timeout=120,
                          env={"COLUMNS": "200", "PATH": ""})  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    named = set(re.findall(r"examples/\w+\.yaml", proc.stdout))
    assert named == {p.relative_to(ROOT).as_posix() for p in ROOT.glob("examples/train_*.yaml")}
    assert "run.out_dir" in proc.stdout
