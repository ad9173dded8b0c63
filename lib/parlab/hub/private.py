"""What learners must not read on a shared box, kept from them (the system's users only).

Under PARLAB_HUB_SYSTEM_USERS=1 every learner's kernel runs as their own Unix account on the
box that holds the instructor's course root (the repository). What that root keeps for the
instructor, a learner could otherwise read with `open()` from a notebook cell:

- `solutions/` (the answers and the hidden tests), `.git/` (their history: `git show`
  recovers them) and `autograder/valid/` (answers written other ways): their "others"
  permissions are removed, so nobody but their owner and group can enter them;
- `submitted/`, `autograded/`, `feedback/` (every learner's work, graded notebooks with the
  hidden tests in them): made before anything lands in them, others nothing;
- `gradebook.db` (nbgrader keeps every locked cell's source there, hidden tests included, and
  every score), `grades.csv` (and `grades-canvas.csv`, `grades-moodle.csv`), `report.html`,
  `roster.json` (the class list: names, emails): others nothing (the gradebook made empty, which
  sqlite takes as a new database, so that nbgrader never creates it readable by all).

With the instructors' group (`group`, a gid: the hub's PARLAB_HUB_INSTRUCTOR_GROUP) all of
them, and everything in them, are given to that group with read and write (folders
`g+rwxs`: what is made in them later takes the group), and the course root itself is made
group-writable (`g+rwxs`; sqlite writes its journal beside gradebook.db): an instructor in
the group grades and runs the formgrader as themself, no root. What they write with umask 022
(0644, 0755) stays out of learners' reach, since others cannot enter the folders above it.
Without a group: folders 0700, files 0600 (root alone). `course/`, `lib/`, `.venv*` and
`autograder/hub/` are left readable: learners' servers run from them.

The hub's configuration calls `keep_private(course_root, group=gid)` as root when it starts
and prints what it changed. `make lab` on a learner's own laptop never needs it.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

__all__ = ["keep_private", "HIDDEN", "INSTRUCTOR_FOLDERS", "INSTRUCTOR_FILES"]

HIDDEN = ("solutions", ".git", "autograder/valid")       # others lose r, w and x
INSTRUCTOR_FOLDERS = ("submitted", "autograded", "feedback")  # made if missing, others nothing
INSTRUCTOR_FILES = ("gradebook.db", "grades.csv", "report.html",  # the gradebook made
                    "grades-canvas.csv", "grades-moodle.csv", "roster.json")


def keep_private(course_root: str | os.PathLike[str], group: int | None = None) -> list[str]:
    """Make what learners must not read unreadable to them, and with `group` (a gid) the
    group's to read and write (see the module's docstring); return what was changed, as
    "path: ..." lines (empty when all was so already)."""
    root = Path(course_root)
    changed: list[str] = []

    def mode(path: Path, new: int, gid: int | None = None) -> None:
        info = path.lstat()
        old = stat.S_IMODE(info.st_mode)
        if gid is not None and info.st_gid != gid:
            os.chown(path, -1, gid)
            changed.append(f"{path}: group {info.st_gid} -> {gid}")
        if old != new:
            path.chmod(new)
            changed.append(f"{path}: {old:o} -> {new:o}")

    def inside(top: Path) -> None:
        """Everything below `top` to the group: folders g+rwxs, files g+rw (symlinks left)."""
        if group is None:
            return
        count = 0
        for folder, dirs, files in os.walk(top):
            for name in [*dirs, *files]:
                path = Path(folder) / name
                info = path.lstat()
                if stat.S_ISLNK(info.st_mode):
                    continue
                wanted = 0o2070 if stat.S_ISDIR(info.st_mode) else 0o060
                if info.st_gid != group or stat.S_IMODE(info.st_mode) & wanted != wanted:
                    os.chown(path, -1, group)   # clears a file's setgid: set the mode after
                    path.chmod(stat.S_IMODE(info.st_mode) | wanted)
                    count += 1
        if count:
            changed.append(f"{top}/*: {count} given to group {group} (g+rw, folders g+s)")

    if group is not None:
        mode(root, stat.S_IMODE(root.lstat().st_mode) | 0o2070, group)
    for name in HIDDEN:
        path = root / name
        if path.is_dir() and not path.is_symlink():
            old = stat.S_IMODE(path.lstat().st_mode)
            mode(path, (old | 0o2070 if group is not None else old) & ~0o007, group)
            inside(path)
    for name in INSTRUCTOR_FOLDERS:
        path = root / name
        path.mkdir(mode=0o700, exist_ok=True)
        mode(path, 0o2770 if group is not None else 0o700, group)
        inside(path)
    for name in INSTRUCTOR_FILES:
        path = root / name
        if name == "gradebook.db":
            path.touch(mode=0o600, exist_ok=True)
        if path.is_file() and not path.is_symlink():
            mode(path, 0o660 if group is not None else 0o600, group)
    return changed
