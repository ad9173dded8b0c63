"""Who has fetched, submitted (when, how late), been graded and had feedback returned.

    make status MODULE=00_collectives        # python -m parlab.hub.status --module ...
    make status                              # every module anyone has a record of

One row per student of the roster (the gradebook's students, where the hub's roster import or
`nbgrader db student add` put them, and PARLAB_HUB_LEARNERS when given) and of anyone else with
a record (marked "not on the roster"). Each column comes from the record its step leaves, never
from what we remember doing:

| column    | under the hub (nbgrader's exchange)             | without it (`make collect`)     |
|-----------|-------------------------------------------------|---------------------------------|
| fetched   | the exchange's fetched/ (parlab.hub.records)    | -                               |
| submitted | the latest hand-in in the exchange's inbound/   | submitted/'s timestamp.txt      |
| late by   | that time past the gradebook's due date         | the same                        |
| collected | submitted/<student>/<module>/timestamp.txt: the latest hand-in, or older  |
| graded    | the gradebook's score less the late penalty, of its maximum; manual cells  |
| feedback  | made (feedback/), returned (the exchange's feedback/, by nbgrader's hash)  |

The exchange is PARLAB_HUB_EXCHANGE (else autograder/hub/run/exchange) and the course
PARLAB_HUB_COURSE_ID, as for `make hub-collect`; it is used when its course folder exists. The
course root is PARLAB_COURSE_ROOT, else the repository. Run it as an instructor (in the
instructors' group) or root: learners cannot read these records. The same table is a page of
the instructor's server under the hub (parlab.hub.status_page).
"""

from __future__ import annotations

import argparse
import datetime as dt
import os
import sys
from dataclasses import dataclass
from pathlib import Path

from nbgrader.utils import notebook_hash, parse_utc

from parlab.grading.paths import REPO_ROOT, list_modules
from parlab.grading.status import (
    CourseRecord,
    course_records,
    duedate,
    gradebook_modules,
    gradebook_students,
)
from parlab.hub.exchange import exchange_settings
from parlab.hub.records import Fetch, fetches

__all__ = ["Row", "Table", "status_table", "render_text", "course_root", "exchange_course",
           "cells", "summary", "COLUMNS", "main"]
COLUMNS = ("student", "fetched", "submitted", "late by", "collected", "graded", "feedback")


@dataclass
class Row:
    """One student's module (times naive UTC, as nbgrader's)."""

    student: str
    on_roster: bool
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
    return Path(os.environ.get("PARLAB_COURSE_ROOT") or REPO_ROOT).resolve()


def exchange_course() -> Path | None:
    """The course's folder in nbgrader's exchange, where the hub made one; else None."""
    root, course = exchange_settings()
    folder = root / course
    return folder if (folder / "inbound").is_dir() else None


def _hand_ins(course: Path, module: str) -> dict[str, list[dt.datetime]]:
    """The exchange's inbound submissions of `module` by student, as nbgrader's collect reads
    their names (<student>+<module>+<time>[+<random>])."""
    found: dict[str, list[dt.datetime]] = {}
    try:
        names = os.listdir(course / "inbound")
    except OSError:
        return found
    for name in names:
        parts = name.rsplit("+", 3)
        if len(parts) < 3 or parts[1] != module:
            continue
        if len(parts) == 3:
            parts.append("")
        try:
            found.setdefault(parts[0], []).append(parse_utc(parts[2]))
        except (ValueError, OverflowError):
            continue
    return {s: sorted(t) for s, t in found.items()}


def returned(root: Path, exchange: Path | None, student: str, module: str,
             pages: list[Path]) -> bool | None:
    """Whether every feedback page made for this submission is in the exchange's feedback/
    (None without an exchange, or no page), as nbgrader's release_feedback names it: the md5
    of the submission's secret and the notebook's name."""
    if exchange is None or not pages:
        return None
    secret = None
    for folder in (root / "feedback" / student / module, root / "submitted" / student / module):
        try:
            secret = (folder / "submission_secret.txt").read_text()
            break
        except OSError:
            continue
    if secret is None:
        return False
    for page in pages:
        out = exchange / "feedback" / f"{notebook_hash(secret=secret, notebook_id=page.stem)}.html"
        try:
            if out.stat().st_mtime < page.stat().st_mtime:   # made again since it went out
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
    roster = set(gradebook_students(root)) | set(learners)
    got = fetches(exchange, module) if exchange else {}
    hand_ins = _hand_ins(exchange, module) if exchange else {}
    records = course_records(root, module)
    rows = [Row(s, s in roster or not roster, got.get(s), hand_ins.get(s, []),
                records.get(s, CourseRecord()))
            for s in sorted(roster | set(got) | set(hand_ins) | set(records))]
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
    back = returned(table.root, table.exchange, row.student, table.module, rec.feedback)
    feedback = ("-" if not rec.feedback else "made" if back is None else
                "returned" if back else "made, not returned")
    fetched = "-" if row.fetched is None else when(row.fetched.first) + (
        f" ({row.fetched.count}x)" if row.fetched.count > 1 else "")
    count = f" ({len(row.handed_in)}x)" if len(row.handed_in) > 1 else ""
    return {"student": row.student + ("" if row.on_roster else " (not on the roster)"),
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
    parser = argparse.ArgumentParser(prog="python -m parlab.hub.status", description=__doc__,
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
