"""Collect: copy learners' submissions into submitted/<student>/<module>/, as nbgrader wants.

Accepted layouts: FROM/<student>/<module>/<files> (nbgrader's own) and
FROM/<student>/<module>.ipynb (one released notebook per file).
"""

from __future__ import annotations

import datetime as dt
import shutil
from pathlib import Path

from parlab.grading.notebooks import unreadable_reason
from parlab.grading.paths import REPO_ROOT, list_modules

TIMESTAMP_FORMAT = "%Y-%m-%d %H:%M:%S.%f UTC"  # what nbgrader reads from timestamp.txt


def collect(source: Path, root: Path = REPO_ROOT) -> list[tuple[str, str, str]]:
    """Copy submissions from `source` into root/submitted/<student>/<module>/.

    Accepted layouts: <student>/<module>/<files> (nbgrader's own) and <student>/<module>.ipynb
    (one released notebook per file). A submission replaces an earlier one of the same student
    and module. timestamp.txt (for late penalties) is kept, or written from the file's mtime.
    Returns (student, module, note) for everything collected.
    """
    source, root = Path(source).resolve(), Path(root).resolve()
    modules = set(list_modules(root / "solutions"))
    if not source.is_dir():
        raise SystemExit(f"collect: {source} is not a folder")
    found: list[tuple[str, str, Path]] = []  # (student, module, folder or notebook)
    for student_dir in sorted(p for p in source.iterdir() if p.is_dir()):
        if student_dir.name.startswith((".", "_")):
            continue
        for entry in sorted(student_dir.iterdir()):
            name = entry.name if entry.is_dir() else entry.stem
            if name in modules and (entry.is_dir() or entry.suffix == ".ipynb"):
                found.append((student_dir.name, name, entry))
    collected = []
    for student, module, entry in found:
        dest = root / "submitted" / student / module
        note = "replaced an earlier submission" if dest.exists() else "new"
        if dest.exists():
            shutil.rmtree(dest)
        if entry.is_dir():
            shutil.copytree(entry, dest, ignore=shutil.ignore_patterns(
                ".ipynb_checkpoints", "__pycache__", ".*"))
        else:
            dest.mkdir(parents=True)
            shutil.copy2(entry, dest / f"{module}.ipynb")
        notebook = dest / f"{module}.ipynb"
        if not notebook.exists():
            note += f"; no {module}.ipynb: its tests will score 0"
        elif why := unreadable_reason(notebook):
            note += f"; unreadable notebook ({why}): it will be graded 0 with that message"
        if not (dest / "timestamp.txt").exists() and notebook.exists():
            when = dt.datetime.fromtimestamp(notebook.stat().st_mtime, dt.timezone.utc)
            (dest / "timestamp.txt").write_text(when.strftime(TIMESTAMP_FORMAT))
        collected.append((student, module, note))
    return collected
