"""Who has fetched, submitted (when, how late), been graded and had feedback returned.

    make status MODULE=00_collectives     # python -m parlab.grading.report.status --module ...
    make status                           # every module anyone has a record of

One row per student of the roster (the class list of `make hub-roster`, parlab.hub.roster,
its retired students marked so; the gradebook's students; PARLAB_HUB_LEARNERS when given) and
of anyone else with a record (marked "not on the roster"). Each column is read from the record
its step leaves:

- fetched: the exchange's fetched/ (parlab.hub.records; under the hub only);
- submitted: the latest hand-in in the exchange's inbound/ (`(3x)`: how many), else the
  collected one's `submitted/<student>/<module>/timestamp.txt` (a class of `make collect`);
- late by: past the gradebook's due date (`nbgrader db assignment add M --duedate=...`);
- collected: timestamp.txt in submitted/, and whether it is the latest hand-in;
- graded: the gradebook's score less the late penalty, of its maximum; manual grading to do;
- feedback: made (`feedback/<student>/<module>/*.html`) and returned (the page nbgrader's
  release_feedback put in the exchange, by its hash of the submission).

The gradebook is only read: a missing or empty one (as the hub leaves it before the first
collect) reads as no students and no grades, and is never created here. The exchange
(PARLAB_HUB_EXCHANGE, PARLAB_HUB_COURSE_ID, as for `make hub-collect`) is read when the hub
made it; the course root is PARLAB_COURSE_ROOT, else the repository. Run it as an instructor
or root: learners cannot read these records. The instructor's hub server shows the same table
(parlab.grading.report.status_page). Times are nbgrader's: naive datetimes in UTC.
"""

from __future__ import annotations

import argparse
import datetime as dt
import os
import sqlite3
import sys
from dataclasses import dataclass, field
from pathlib import Path

from nbgrader.api import Gradebook, MissingEntry
from nbgrader.utils import parse_utc

from parlab.grading.base.paths import REPO_ROOT, list_modules
from parlab.hub.records import Fetch, exchange_course, fetches, hand_ins, released_page
from parlab.hub.roster import Roster

__all__ = ["CourseRecord", "course_records", "duedate", "gradebook_students", "Row", "Table",
           "status_table", "render_text", "course_root", "cells", "summary", "COLUMNS", "main"]
COLUMNS = ("student", "fetched", "submitted", "late by", "collected", "graded", "feedback")


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


@dataclass
class Row:
    """One student's module (times naive UTC, as nbgrader's)."""

    student: str
    note: str                           # '', 'not on the roster', 'retired'
    fetched: Fetch | None
    handed_in: list[dt.datetime]        # every hand-in in the exchange, oldest first
    course: CourseRecord

    @property
    def submitted(self) -> dt.datetime | None:
        """The latest hand-in: the exchange's, else the collected one's."""
        return self.handed_in[-1] if self.handed_in else self.course.collected


@dataclass
class Table:
    module: str
    root: Path                          # the course root
    due: dt.datetime | None
    exchange: Path | None               # the course's folder in the exchange, if used
    rows: list[Row]


def course_root() -> Path:
    """PARLAB_COURSE_ROOT, else the repository."""
    return Path(os.environ.get("PARLAB_COURSE_ROOT") or REPO_ROOT).resolve()


def returned(table: Table, student: str, pages: list[Path]) -> bool | None:
    """Whether the exchange's feedback/ holds every page made for this submission, as new as
    it (None without an exchange or a page)."""
    if table.exchange is None or not pages:
        return None
    for folder in (table.root / "feedback" / student / table.module,
                   table.root / "submitted" / student / table.module):
        try:
            secret = (folder / "submission_secret.txt").read_text()
            break
        except OSError:
            continue
    else:
        return False
    for page in pages:
        try:
            if released_page(table.exchange, secret, page.stem).stat().st_mtime < \
                    page.stat().st_mtime:             # made again since it went out
                return False
        except OSError:
            return False
    return True


def status_table(module: str, root: Path | None = None, exchange: Path | None = None,
                 learners: list[str] | None = None) -> Table:
    """The table for one module (see the module docstring)."""
    root = root or course_root()
    if learners is None:
        learners = [n.strip() for n in os.environ.get("PARLAB_HUB_LEARNERS", "").split(",")
                    if n.strip()]
    class_list = Roster.load(root)
    roster = set(gradebook_students(root)) | set(learners) | set(class_list.students)
    got = fetches(exchange, module) if exchange else {}
    handed = hand_ins(exchange, module) if exchange else {}
    records = course_records(root, module)
    notes = {**{s: "retired" for s in class_list.retired()}, **{s: "" for s in learners}}
    rows = [Row(s, notes.get(s, "" if s in roster or not roster else "not on the roster"),
                got.get(s), handed.get(s, []), records.get(s, CourseRecord()))
            for s in sorted(roster | set(got) | set(handed) | set(records))]
    return Table(module, root, duedate(root, module), exchange, rows)


def modules_with_records(root: Path, exchange: Path | None) -> list[str]:
    found = set(gradebook_modules(root))
    for student in list_modules(root / "submitted"):
        found |= set(list_modules(root / "submitted" / student))
    if exchange is not None:
        found |= set(list_modules(exchange / "outbound"))
    return sorted(found)


def when(t: dt.datetime | None) -> str:
    return "-" if t is None else t.strftime("%Y-%m-%d %H:%M UTC")


def how_long(delta: dt.timedelta) -> str:
    """A duration as '2 d 3 h', '3 h 5 min', '42 s'."""
    s = int(delta.total_seconds())
    d, h, m = s // 86400, s % 86400 // 3600, s % 3600 // 60
    if d:
        return f"{d} d {h} h"
    if h:
        return f"{h} h {m} min"
    return f"{m} min" if m else f"{s} s"


def cells(table: Table, row: Row) -> dict[str, str]:
    """The row's columns as text (the same for the terminal and the page)."""
    rec, sub = row.course, row.submitted
    late = "-"
    if sub is not None and table.due is not None:
        late = how_long(sub - table.due) if sub > table.due else "on time"
    if sub is None:
        collected = "-"
    elif rec.collected is None:
        collected = "not yet"
    elif rec.collected < sub:
        collected = f"an older one ({when(rec.collected)})"
    else:
        collected = "yes"
    if rec.score is None:
        graded = "-"
    else:
        graded = f"{max(0.0, rec.score - rec.penalty):g}/{rec.max_score:g}"
        graded += f" (late penalty {rec.penalty:g})" if rec.penalty else ""
        graded += ", manual grading to do" if rec.needs_manual else ""
    back = returned(table, row.student, rec.feedback)
    feedback = ("-" if not rec.feedback else "made" if back is None else
                "returned" if back else "made, not returned")
    fetched = "-" if row.fetched is None else when(row.fetched.first) + (
        f" ({row.fetched.count}x)" if row.fetched.count > 1 else "")
    count = f" ({len(row.handed_in)}x)" if len(row.handed_in) > 1 else ""
    return {"student": row.student + (f" ({row.note})" if row.note else ""),
            "fetched": fetched if table.exchange else "", "submitted": when(sub) + count,
            "late by": late, "collected": collected, "graded": graded, "feedback": feedback}


def summary(table: Table) -> str:
    rows = table.rows
    n = len(rows)
    parts = [f"{sum(r.fetched is not None for r in rows)} of {n} fetched"] if table.exchange else []
    times = [r.submitted for r in rows if r.submitted is not None]
    late = len([t for t in times if table.due is not None and t > table.due])
    parts += [f"{len(times)} submitted" + (f" ({late} late)" if late else ""),
              f"{sum(r.course.collected is not None for r in rows)} collected",
              f"{sum(r.course.score is not None for r in rows)} graded",
              f"{sum(bool(r.course.feedback) for r in rows)} with feedback"]
    return ", ".join(parts)


def render_text(table: Table) -> str:
    """The table for a terminal."""
    due = when(table.due) if table.due else "(no due date in the gradebook)"
    head = (f"{table.module}: due {due}; "
            + ("records of the exchange " + str(table.exchange) if table.exchange
               else "no exchange: the course root's records only"))
    rows = [cells(table, r) for r in table.rows]
    columns = [c for c in COLUMNS if c != "fetched" or table.exchange]
    widths = {c: max([len(c), *(len(r[c]) for r in rows)]) for c in columns}
    lines = [head, "  ".join(c.ljust(widths[c]) for c in columns)]
    lines += ["  ".join(r[c].ljust(widths[c]) for c in columns) for r in rows]
    lines.append(summary(table) if rows else "nobody on the roster and no record yet")
    return "\n".join(line.rstrip() for line in lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m parlab.grading.report.status",
                                     description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--module", help="one module (default: every module with a record)")
    parser.add_argument("--root", type=Path, default=None, help="the course root")
    args = parser.parse_args(argv)
    root = (args.root or course_root()).resolve()
    exchange = exchange_course()
    modules = [args.module] if args.module else modules_with_records(root, exchange)
    if args.module and not (root / "course" / args.module).is_dir() and \
            args.module not in modules_with_records(root, exchange):
        print(f"make status: no module {args.module!r} (ls {root / 'course'})", file=sys.stderr)
        return 2
    if not modules:
        print("no module has a record yet (nothing released, collected or in the gradebook)")
        return 0
    for i, module in enumerate(modules):
        table = status_table(module, root, exchange)
        print(("\n" if i else "") + render_text(table))
    return 0


if __name__ == "__main__":
    sys.exit(main())
