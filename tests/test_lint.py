"""The code base stays ruff clean and its files stay small (the style guide's ~300 lines)."""

from __future__ import annotations

import subprocess
import sys

from conftest import ROOT

MAX_LINES = 320  # "about 300": a little slack, never a thousand-line file


def test_ruff_clean():
    ruff = [sys.executable, "-m", "ruff", "check", "lib", "tests", "benchmarks", "autograder",
            "scripts"]
    proc = subprocess.run(ruff, cwd=ROOT, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_library_files_are_small():
    long = {str(p.relative_to(ROOT)): n for p in (ROOT / "lib").rglob("*.py")
            if (n := len(p.read_text().splitlines())) > MAX_LINES}
    assert not long, f"split these files (over {MAX_LINES} lines): {long}"
