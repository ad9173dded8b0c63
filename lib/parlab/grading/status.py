"""Where each student of a module stands, from the course root's own records (`make status`).

    records = course_records(root, "00_collectives")   # {student: CourseRecord}
    due = duedate(root, "00_collectives")              # the gradebook's, or None

What the course root knows, each from the place nbgrader itself keeps it:

- collected: `submitted/<student>/<module>/timestamp.txt` (the hand-in time nbgrader, `make
  collect` and the hub's `make hub-collect` write there);
- graded: the gradebook's submission of the module (after `make autograde`): score, late
  penalty, maximum, and whether a cell waits for manual grading;
- feedback made: `feedback/<student>/<module>/*.html` (`make feedback`);
- the roster: the gradebook's students (`nbgrader db student add/import`, which the hub's roster
  import fills); the due date: the gradebook's (`nbgrader db assignment add MODULE --duedate=`).

The gradebook is only read: a missing or empty one (as the hub leaves it before the first
collect) reads as no students and no grades, and is never created here. Times are nbgrader's:
naive datetimes in UTC. parlab.hub.status adds the exchange's records (fetched, handed in,
feedback returned) and prints the table.
"""

from __future__ import annotations

import datetime as dt
import sqlite3
from dataclasses import dataclass, field
from pathlib import Path

from nbgrader.api import Gradebook, MissingEntry
from nbgrader.utils import parse_utc

from parlab.grading.paths import list_modules

__all__ = ["CourseRecord", "course_records", "duedate", "gradebook_students",
           "gradebook_modules", "read_timestamp"]


@dataclass
class CourseRecord:
    """One student's module, as the course root has it (None: not there)."""

    collected: dt.datetime | None = None      # the collected submission's hand-in time
    score: float | None = None                # raw score (autograded, and manual where given)
    penalty: float = 0.0                      # late penalty taken from it
    max_score: float | None = None
    needs_manual: bool = False
    feedback: list[Path] = field(default_factory=list)    # feedback/<student>/<module>/*.html


def read_timestamp(folder: Path) -> dt.datetime | None:
    """The time in `folder`/timestamp.txt (naive UTC), or None."""
    try:
        return parse_utc((folder / "timestamp.txt").read_text().strip())
    except (OSError, ValueError):
        return None


def _gradebook(root: Path) -> Gradebook | None:
    """The course's gradebook, read without ever creating it: None when it has no tables."""
    db = root / "gradebook.db"
    try:
        with sqlite3.connect(f"file:{db}?mode=ro", uri=True) as con:
            found = con.execute("SELECT count(*) FROM sqlite_master WHERE type='table' AND "
                                "name IN ('student', 'assignment')").fetchone()[0]
    except sqlite3.Error:
        return None
    return Gradebook(f"sqlite:///{db}") if found == 2 else None


def gradebook_students(root: Path) -> list[str]:
    """The gradebook's students (the roster, where one was imported)."""
    gb = _gradebook(root)
    if gb is None:
        return []
    with gb:
        return sorted(s.id for s in gb.students)


def gradebook_modules(root: Path) -> list[str]:
    """The modules the gradebook knows."""
    gb = _gradebook(root)
    if gb is None:
        return []
    with gb:
        return sorted(a.name for a in gb.assignments)


def duedate(root: Path, module: str) -> dt.datetime | None:
    """The module's due date in the gradebook (naive UTC), or None."""
    gb = _gradebook(root)
    if gb is None:
        return None
    with gb:
        try:
            return gb.find_assignment(module).duedate
        except MissingEntry:
            return None


def course_records(root: Path, module: str) -> dict[str, CourseRecord]:
    """Every student the course root has something of for `module`, with what it has."""
    root = Path(root)
    records: dict[str, CourseRecord] = {}
    for student in list_modules(root / "submitted"):
        folder = root / "submitted" / student / module
        if folder.is_dir():
            records[student] = CourseRecord(collected=read_timestamp(folder))
    gb = _gradebook(root)
    if gb is not None:
        with gb:
            try:
                submissions = gb.assignment_submissions(module)
            except MissingEntry:
                submissions = []
            for sub in submissions:
                rec = records.setdefault(sub.student_id, CourseRecord())
                rec.score, rec.max_score = sub.score, sub.max_score
                rec.penalty = sub.late_submission_penalty or 0.0
                rec.needs_manual = bool(sub.needs_manual_grade)
    for student in list_modules(root / "feedback"):
        pages = sorted((root / "feedback" / student / module).glob("*.html"))
        if pages:
            records.setdefault(student, CourseRecord()).feedback = pages
    return records
