"""What learners must not read on a shared box, kept from them (the system's users only).

Under PARLAB_HUB_SYSTEM_USERS=1 every learner's kernel runs as their own Unix account on the
box that holds the instructor's course root (the repository). What that root keeps for the
instructor, a learner could otherwise read with `open()` from a notebook cell:

- `solutions/` (the answers and the hidden tests), `.git/` (their history: `git show`
  recovers them) and `autograder/valid/` (answers written other ways): their "others"
  permissions are removed, so nobody but their owner and group can enter them;
- `submitted/`, `autograded/`, `feedback/` (every learner's work, graded notebooks with the
  hidden tests in them): made 0700 before anything lands in them;
- `gradebook.db` (nbgrader keeps every locked cell's source there, hidden tests included, and
  every score), `grades.csv`, `report.html`: made 0600 (the gradebook made empty, which sqlite
  takes as a new database, so that nbgrader never creates it readable by all).

The hub's configuration calls `keep_private(course_root)` as root when it starts and prints
what it changed. `make lab` on a learner's own laptop never needs it.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

__all__ = ["keep_private", "HIDDEN", "INSTRUCTOR_FOLDERS", "INSTRUCTOR_FILES"]

HIDDEN = ("solutions", ".git", "autograder/valid")       # others lose r, w and x
INSTRUCTOR_FOLDERS = ("submitted", "autograded", "feedback")  # 0700, made if missing
INSTRUCTOR_FILES = ("gradebook.db", "grades.csv", "report.html")  # 0600 (the gradebook made)


def keep_private(course_root: str | os.PathLike[str]) -> list[str]:
    """Make what learners must not read unreadable to them (see the module's docstring);
    return what was changed, as "path: mode" lines (empty when all was private already)."""
    root = Path(course_root)
    changed: list[str] = []

    def mode(path: Path, new: int) -> None:
        old = stat.S_IMODE(path.lstat().st_mode)
        if old != new:
            path.chmod(new)
            changed.append(f"{path}: {old:o} -> {new:o}")

    for name in HIDDEN:
        path = root / name
        if path.is_dir() and not path.is_symlink():
            mode(path, stat.S_IMODE(path.lstat().st_mode) & ~0o007)
    for name in INSTRUCTOR_FOLDERS:
        path = root / name
        path.mkdir(mode=0o700, exist_ok=True)
        mode(path, 0o700)
    for name in INSTRUCTOR_FILES:
        path = root / name
        if name == "gradebook.db":
            path.touch(mode=0o600, exist_ok=True)
        if path.is_file() and not path.is_symlink():
            mode(path, 0o600)
    return changed
