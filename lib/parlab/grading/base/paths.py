"""Where the course lives: the repository's folders, and the modules in one of them."""

from __future__ import annotations

from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[4]  # lib/parlab/grading/base/paths.py
AUTOGRADER_DIR = REPO_ROOT / "autograder"  # holds nbgrader_config.py; nbgrader runs from here
SOLUTIONS_DIR = REPO_ROOT / "solutions"  # nbgrader source
COURSE_DIR = REPO_ROOT / "course"  # nbgrader release
WORKSPACE_DIR = REPO_ROOT / "workspace"  # the learner's copy of course/, made by `make lab`


def list_modules(directory: Path) -> list[str]:
    """Module folders in `directory` (solutions/, course/), sorted; hidden and _private skipped."""
    if not directory.is_dir():
        return []
    return sorted(
        p.name for p in directory.iterdir() if p.is_dir() and not p.name.startswith((".", "_"))
    )
