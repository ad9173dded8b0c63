"""grades.csv: one row per student for each released module that anyone handed in.

Rows only for modules that are released (in course/) and have a submission or a gradebook
entry; one row for each student in the gradebook or in submitted/. The `status` column tells
apart what nbgrader's own export writes alike as a score:

    submitted          graded; the scores are the gradebook's
    could not be read  the file was not a notebook (cut short, not JSON): every test scored 0
    not graded         collected (or in the gradebook) but with no autograded result yet, or
                       dropped by nbgrader; the score columns are empty (run make autograde)
    not submitted      nothing handed in; scored 0

The other columns are nbgrader's: assignment, duedate, timestamp (the submission's), raw_score,
late_submission_penalty, score (raw_score less the penalty), max_score.
"""

from __future__ import annotations

import csv
from pathlib import Path

import nbformat
from nbgrader.api import Gradebook, MissingEntry

from parlab.grading.base.cells import META
from parlab.grading.base.paths import list_modules

COLUMNS = ["assignment", "duedate", "timestamp", "student_id", "status", "raw_score",
           "late_submission_penalty", "score", "max_score"]
STATUSES = ("submitted", "could not be read", "not graded", "not submitted")


def _students(root: Path, gb: Gradebook) -> list[str]:
    folders = set(list_modules(root / "submitted"))
    return sorted(folders | {s.id for s in gb.students})


def _modules(root: Path, gb: Gradebook) -> list[str]:
    in_gradebook = {a.name for a in gb.assignments if a.submissions}
    handed_in = {m for s in list_modules(root / "submitted")
                 for m in list_modules(root / "submitted" / s)}
    return [m for m in list_modules(root / "course") if m in in_gradebook | handed_in]


def _unreadable(folder: Path) -> bool:
    for path in folder.glob("*.ipynb"):
        if nbformat.read(str(path), as_version=4).metadata.get(META, {}).get("unreadable"):
            return True
    return False


def _row(root: Path, gb: Gradebook, module: str, student: str) -> dict[str, object]:
    try:
        assignment = gb.find_assignment(module)
        row: dict[str, object] = {"duedate": assignment.duedate or "",
                                  "max_score": assignment.max_score}
    except MissingEntry:
        assignment, row = None, {"duedate": "", "max_score": ""}
    row.update(assignment=module, student_id=student, timestamp="", raw_score="",
               late_submission_penalty="", score="")
    handed_in = (root / "submitted" / student / module).is_dir()
    try:
        sub = gb.find_submission(module, student) if assignment else None
    except MissingEntry:
        sub = None
    graded = root / "autograded" / student / module
    if sub is not None and all((graded / f"{nb.name}.ipynb").exists() for nb in sub.notebooks):
        penalty = sub.late_submission_penalty or 0.0
        row.update(status="could not be read" if _unreadable(graded) else "submitted",
                   timestamp=sub.timestamp or "", raw_score=sub.score,
                   late_submission_penalty=penalty, score=max(0.0, sub.score - penalty))
    elif sub is not None or handed_in:
        row.update(status="not graded")
    else:
        row.update(status="not submitted", raw_score=0.0, late_submission_penalty=0.0,
                   score=0.0)
    return row


def export_grades(root: Path, to: Path) -> list[dict[str, object]]:
    """Write grades.csv (the module doc) to `to`; the rows."""
    root = Path(root).resolve()
    rows = []
    db = root / "gradebook.db"
    with Gradebook(f"sqlite:///{db}") as gb:
        for module in _modules(root, gb):
            rows += [_row(root, gb, module, s) for s in _students(root, gb)]
    with open(to, "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=COLUMNS)
        writer.writeheader()
        writer.writerows(rows)
    return rows
