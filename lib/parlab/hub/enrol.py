"""`make hub-roster ROSTER=class.csv`: a learning platform's class list into the gradebook, the
hub's learners and (under the system's users) Unix accounts, saying what it changed.

    python -m parlab.hub.enrol class.csv [--id-column COLUMN] [--dry-run]

Read with the hub's settings, which make passes on: PARLAB_COURSE_ROOT (where gradebook.db and
roster.json are; default the repository), PARLAB_HUB_SYSTEM_USERS=1 (Unix accounts too: as
root), PARLAB_HUB_LOGIN (`lti13` or `lti11`: the platform logs learners in, so their accounts
get no password) and PARLAB_HUB_RUN (where the one-time passwords go; autograder/hub/run).

In this order, stopping at the first problem with a message: the CSV read (parlab.hub.roster),
compared with roster.json; the accounts checked (no system account taken as a student's);
every listed student into nbgrader's gradebook with nbgrader's own `nbgrader db student
import` (name, email, the platform's id as `lms_user_id`; a retired student is never removed:
their grades stay); the accounts of new students made and of returning ones unlocked, those of
retired students locked (parlab.hub.accounts); roster.json written (the hub reads it at every
login: no restart); the one-time passwords into a file only root reads.
"""

from __future__ import annotations

import argparse
import contextlib
import csv
import datetime as dt
import os
import sqlite3
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path

from parlab.hub.accounts import (
    AccountProblem,
    check_accounts,
    lock_accounts,
    make_accounts,
    write_passwords,
)
from parlab.hub.roster import Changes, Roster, RosterError, Student, plan, read_class_csv

REPO_ROOT = Path(__file__).resolve().parents[3]
GRADEBOOK_COLUMNS = ("id", "first_name", "last_name", "email", "lms_user_id")


def course_root() -> Path:
    return Path(os.environ.get("PARLAB_COURSE_ROOT") or REPO_ROOT).resolve()


def grades_kept(root: Path) -> dict[str, int]:
    """{student: number of graded submissions} in the gradebook (none: empty), read from
    nbgrader's tables with sqlite itself (importing nbgrader takes seconds)."""
    db = root / "gradebook.db"
    if not db.exists() or db.stat().st_size == 0:
        return {}
    with contextlib.closing(sqlite3.connect(f"file:{db}?mode=ro", uri=True)) as con:
        counts = dict(con.execute("SELECT student_id, COUNT(*) FROM submitted_assignment "
                                  "GROUP BY student_id").fetchall())
        return {sid: counts.get(sid, 0) for (sid,) in con.execute("SELECT id FROM student")}


def import_students(root: Path, students: Sequence[Student]) -> None:
    """`nbgrader db student import` of `students`, run as the course's make targets run
    nbgrader (from autograder/, its configuration, the venv's bin/ first on PATH)."""
    db = root / "gradebook.db"
    if not db.exists():             # sqlite takes an empty file as a new database: never
        db.touch(mode=0o600)        # made readable by all (parlab.hub.private)
    with tempfile.TemporaryDirectory(prefix="parlab-roster-") as tmp:
        listing = Path(tmp) / "students.csv"
        with open(listing, "w", newline="", encoding="utf-8") as f:
            writer = csv.writer(f)
            writer.writerow(GRADEBOOK_COLUMNS)
            writer.writerows([s.id, s.first_name, s.last_name, s.email, s.lms_user_id]
                             for s in students)
        env = {**os.environ, "PYTHONUTF8": "1",
               "PATH": os.pathsep.join([str(Path(sys.executable).parent),
                                        os.environ.get("PATH", "")])}
        proc = subprocess.run([sys.executable, "-m", "nbgrader", "db", "student", "import",
                               str(listing), f"--CourseDirectory.root={root}"],
                              cwd=REPO_ROOT / "autograder", env=env, capture_output=True,
                              text=True, timeout=300)
    if proc.returncode != 0:
        raise RosterError(f"nbgrader db student import exited {proc.returncode}:\n"
                          f"{(proc.stdout + proc.stderr)[-2000:]}")


def report(changes: Changes, grades: dict[str, int]) -> list[str]:
    def who(students: list[Student]) -> str:
        return ", ".join(f"{s.id} ({s.name})" if s.name else s.id for s in students)
    lines = [f"  added:     {who(changes.added)}" if changes.added else "",
             f"  back:      {who(changes.returned)}" if changes.returned else "",
             f"  updated:   {who(changes.updated)} (name, email or platform ids)"
             if changes.updated else "",
             "  retired:   " + ", ".join(f"{s.id} ({grades.get(s.id, 0)} graded submissions "
                                         "kept)" for s in changes.retired)
             if changes.retired else "",
             f"  unchanged: {len(changes.kept)}"]
    return [line for line in lines if line]


def enrol(csv_path: Path, *, id_column: str | None = None, dry_run: bool = False) -> int:
    root, system_users = course_root(), os.environ.get("PARLAB_HUB_SYSTEM_USERS") == "1"
    passwords = os.environ.get("PARLAB_HUB_LOGIN", "") not in ("lti13", "lti11")
    listed = read_class_csv(csv_path, id_column)
    roster = Roster.load(root)
    changes = plan(roster, listed)
    before = grades_kept(root)
    print(f"class list {csv_path}: {len(listed)} students; roster {roster.path}")
    print("\n".join(report(changes, before)))
    if dry_run:
        print("dry run: nothing changed")
        return 0
    arriving = [*changes.added, *changes.returned]
    if system_users:
        check_accounts(arriving)
    import_students(root, listed)
    after = grades_kept(root)
    lost = {s: (n, after.get(s, 0)) for s, n in before.items() if after.get(s, 0) < n}
    if lost:
        raise RosterError(f"graded submissions lost in the gradebook (before, after): {lost}")
    print(f"gradebook {root / 'gradebook.db'}: {len(listed)} students imported (nbgrader db "
          f"student import); {sum(after.values())} graded submissions, as before "
          f"({len(after)} students in it, retired ones included)")
    made: dict[str, str] = {}
    try:
        if system_users:
            made, said = make_accounts(arriving, passwords=passwords,
                                       returning=[s.id for s in changes.returned])
            said += lock_accounts(changes.retired)
            print("\n".join(f"  {line}" for line in said))
        else:
            print("accounts: none (the trial: every learner is your Unix user; "
                  "PARLAB_HUB_SYSTEM_USERS=1 makes the box's accounts, as root)")
    finally:
        roster.save()
        if made:
            run = Path(os.environ.get("PARLAB_HUB_RUN") or REPO_ROOT / "autograder/hub/run")
            stamp = dt.datetime.now().strftime("%Y%m%d-%H%M%S")
            path = write_passwords(run, made, stamp)
            print(f"one-time passwords of the {len(made)} accounts made: {path} (readable by "
                  "root alone). Hand each to its learner; they log in with it and change it "
                  "with `passwd` in a terminal of their server (File > New > Terminal)")
    print(f"hub: {len(roster.active())} learners on the class list, {len(roster.retired())} "
          "retired; the hub reads it at every login (no restart needed)")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m parlab.hub.enrol", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("csv", type=Path, help="the platform's CSV of the class")
    parser.add_argument("--id-column", default=None, help="the column of student ids "
                        "(default: the first of username, login, SIS Login ID, ..., id)")
    parser.add_argument("--dry-run", action="store_true", help="say what would change")
    args = parser.parse_args(argv)
    if not args.csv.is_file():
        parser.error(f"no such file: {args.csv} (make hub-roster ROSTER=<the platform's CSV>)")
    try:
        return enrol(args.csv, id_column=args.id_column, dry_run=args.dry_run)
    except (RosterError, AccountProblem) as exc:
        print(f"hub-roster: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
