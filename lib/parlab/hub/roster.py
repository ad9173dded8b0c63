"""The class list from a learning platform: who is a learner, by which id (`make hub-roster`).

    python -m parlab.hub.enrol class.csv [--id-column COL] [--dry-run]   # make hub-roster

The CSV is what a platform exports for a course's participants, read by its header row as
`make collect TIMES=` reads its CSV: a student id column (the first of ID_COLUMNS found:
`username`, `login`, `SIS Login ID`, `student_id`, ..., then a plain `id`), a name
(`name`/`full name`/`Student`, or `first name` and `last name`/`surname`) and an `email`;
optionally the platform's own user id (a plain `id`/`ID` column when another column holds the
student id: Canvas's and Moodle's numeric ids), `SIS User ID` and `Section`.

One id per student serves as the nbgrader student id, the hub's user name and, under the
system's users, the Unix account, so it must be what JupyterHub keeps a name as: lowercase
(JupyterHub lowercases every name at login), letters, digits, `_`, `-`, `.`, starting with a
letter or `_` (a Unix account name). A platform's login name fits (Canvas's SIS Login ID,
Moodle's username), which is also what the platform's LTI launch sends as the custom parameter
`username=$User.username` (parlab.hub.lti).

The course's class list is kept in `<course root>/roster.json` (private like gradebook.db,
parlab.hub.private): every student ever listed, `active` or `retired`. A run with a changed
CSV adds the new students and retires the missing ones: a retired student stays in the
gradebook with every grade, is no longer a hub learner (the hub's login reads this file at
every login: `LoginGate`) and, under the system's users, their account is locked, not deleted
(parlab.hub.accounts). A retired student listed again comes back as they were.
"""

from __future__ import annotations

import csv
import datetime as dt
import json
import os
import re
import tempfile
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

__all__ = ["Student", "Roster", "RosterError", "Changes", "plan", "read_class_csv", "LoginGate",
           "ROSTER_FILE"]

ROSTER_FILE = "roster.json"
ID_COLUMNS = ("username", "user name", "login", "login id", "login_id", "sis login id",
              "student_id", "student id", "user_id", "userid", "id")
NAME_COLUMNS = ("name", "full name", "full_name", "student", "student name")
FIRST_COLUMNS = ("first name", "first_name", "firstname", "given name")
LAST_COLUMNS = ("last name", "last_name", "lastname", "surname", "family name")
EMAIL_COLUMNS = ("email", "email address", "e-mail", "mail")
SIS_COLUMNS = ("sis user id", "sis_user_id")
SECTION_COLUMNS = ("section",)
VALID_ID = re.compile(r"^[a-z_][a-z0-9_.-]{0,31}$")


class RosterError(ValueError):
    """The class list cannot be used as it is; the message says what to change."""


@dataclass
class Student:
    id: str
    first_name: str = ""
    last_name: str = ""
    email: str = ""
    lms_user_id: str = ""     # the platform's own id (Canvas's ID, Moodle's id), if given
    sis_user_id: str = ""
    section: str = ""
    status: str = "active"    # or "retired"
    since: str = ""           # when it became so (UTC, ISO 8601)

    @property
    def name(self) -> str:
        return " ".join(n for n in (self.first_name, self.last_name) if n)

    def details(self) -> tuple[str, ...]:
        return (self.first_name, self.last_name, self.email, self.lms_user_id,
                self.sis_user_id, self.section)


def _column(header: Sequence[str], names: tuple[str, ...]) -> str | None:
    lowered = {h.strip().lower(): h for h in header}
    return next((lowered[n] for n in names if n in lowered), None)


def _split_name(full: str) -> tuple[str, str]:
    """(first, last) of "Last, First" (Canvas's Student column) or "First ... Last"."""
    if "," in full:
        last, first = (p.strip() for p in full.split(",", 1))
        return first, last
    parts = full.split()
    return (" ".join(parts[:-1]), parts[-1]) if len(parts) > 1 else (full.strip(), "")


def read_class_csv(path: Path, id_column: str | None = None) -> list[Student]:
    """The students of a platform's CSV (the module doc); RosterError names what is wrong."""
    with open(path, newline="", encoding="utf-8-sig") as f:
        reader = csv.DictReader(f)
        header = [h for h in (reader.fieldnames or []) if h is not None]
        sid = _column(header, (id_column.lower(),)) if id_column else _column(header, ID_COLUMNS)
        if sid is None:
            raise RosterError(f"{path}: no student id column: its header is {header}; name one "
                              f"of {ID_COLUMNS}, or give it (make hub-roster ... ID=<column>)")
        plain_id = _column(header, ("id",))
        columns = {"name": _column(header, NAME_COLUMNS), "first": _column(header, FIRST_COLUMNS),
                   "last": _column(header, LAST_COLUMNS), "email": _column(header, EMAIL_COLUMNS),
                   "sis": _column(header, SIS_COLUMNS), "section": _column(header, SECTION_COLUMNS),
                   "lms": plain_id if plain_id not in (None, sid) else None}
        students: list[Student] = []
        problems: list[str] = []
        seen: dict[str, int] = {}
        for line, row in enumerate(reader, start=2):
            def get(key: str, row: dict[str, str] = row) -> str:
                col = columns[key]
                return (row.get(col) or "").strip() if col else ""
            ident = (row.get(sid) or "").strip()
            if not ident or ident.lower().startswith("points possible"):
                continue                      # a blank line, or Canvas's points row
            if not VALID_ID.match(ident):
                problems.append(f"line {line}: {ident!r}")
                continue
            if ident in seen:
                raise RosterError(f"{path}: the id {ident!r} is on lines {seen[ident]} and {line}")
            seen[ident] = line
            first, last = get("first"), get("last")
            if not (first or last) and get("name"):
                first, last = _split_name(get("name"))
            students.append(Student(ident, first, last, get("email"), get("lms"), get("sis"),
                                    get("section")))
    if problems:
        raise RosterError(
            f"{path}: column {sid!r} holds ids that cannot be a hub user, an nbgrader student "
            f"and a Unix account: {', '.join(problems[:10])}"
            + (f" and {len(problems) - 10} more" if len(problems) > 10 else "")
            + ". An id is lowercase (JupyterHub lowercases names at login), letters, digits, "
            "_ - . and starts with a letter or _, at most 32 characters: the platform's login "
            "names are (Canvas's SIS Login ID, Moodle's username); name that column with ID=")
    if not students:
        raise RosterError(f"{path}: no students in it (column {sid!r} is empty)")
    return students


@dataclass
class Roster:
    """roster.json in the course root: every student ever listed, active or retired."""

    path: Path
    students: dict[str, Student] = field(default_factory=dict)

    @classmethod
    def load(cls, course_root: str | os.PathLike[str]) -> Roster:
        path = Path(course_root) / ROSTER_FILE
        if not path.exists():
            return cls(path)
        data = json.loads(path.read_text(encoding="utf-8"))
        return cls(path, {k: Student(id=k, **v) for k, v in data["students"].items()})

    @property
    def exists(self) -> bool:
        return self.path.exists()

    def active(self) -> list[str]:
        return sorted(k for k, s in self.students.items() if s.status == "active")

    def retired(self) -> list[str]:
        return sorted(k for k, s in self.students.items() if s.status == "retired")

    def save(self) -> None:
        """Write it whole (a file beside it, renamed over it), keeping the old file's mode and
        group (the hub gives it to the instructors' group); new: readable by its owner only."""
        data = {"students": {k: {n: v for n, v in asdict(s).items() if n != "id"}
                             for k, s in sorted(self.students.items())}}
        fd, tmp = tempfile.mkstemp(dir=self.path.parent, prefix=".roster-", suffix=".json")
        try:
            with os.fdopen(fd, "w", encoding="utf-8") as f:
                json.dump(data, f, indent=1, ensure_ascii=False)
            if self.path.exists():
                old = self.path.stat()
                os.chmod(tmp, old.st_mode & 0o7777)
                if os.geteuid() == 0:
                    os.chown(tmp, old.st_uid, old.st_gid)
            os.replace(tmp, self.path)
        finally:
            if os.path.exists(tmp):
                os.unlink(tmp)


@dataclass
class Changes:
    """What a run changes: ids added, back from retired, retired, with new details; kept."""

    added: list[Student] = field(default_factory=list)
    returned: list[Student] = field(default_factory=list)
    retired: list[Student] = field(default_factory=list)
    updated: list[Student] = field(default_factory=list)
    kept: list[str] = field(default_factory=list)


def plan(roster: Roster, listed: Iterable[Student], now: dt.datetime | None = None) -> Changes:
    """Compare the class list with the roster; apply the changes to `roster` (not saved)."""
    when = (now or dt.datetime.now(dt.timezone.utc)).isoformat(timespec="seconds")
    changes, listed = Changes(), list(listed)
    for new in listed:
        old = roster.students.get(new.id)
        new.since = when
        if old is None:
            changes.added.append(new)
        elif old.status == "retired":
            changes.returned.append(new)
        else:
            new.since = old.since
            if new.details() != old.details():
                changes.updated.append(new)
            else:
                changes.kept.append(new.id)
        roster.students[new.id] = new
    ids = {s.id for s in listed}
    for sid in roster.active():
        if sid not in ids:
            gone = roster.students[sid]
            gone.status, gone.since = "retired", when
            changes.retired.append(gone)
    return changes


class LoginGate:
    """The hub's post-login check (`c.Authenticator.post_auth_hook`), the class list read at
    every login: a name the platform sent (LTI) that is a student's platform id
    (`lms_user_id`) becomes that student's id; then the name must be an instructor, a learner
    given to the hub (PARLAB_HUB_LEARNERS) or an active student of roster.json; a retired
    student and anyone else is refused (HTTP 403) with a line saying why."""

    def __init__(self, course_root: str | os.PathLike[str], learners: Iterable[str],
                 instructors: Iterable[str]) -> None:
        self.course_root = Path(course_root)
        self.fixed = {n.lower() for n in (*learners, *instructors)}

    def __call__(self, authenticator: Any, handler: Any, auth_model: dict) -> dict:
        from tornado.web import HTTPError

        roster = Roster.load(self.course_root)
        name = auth_model["name"]
        by_platform = {s.lms_user_id.lower(): s.id for s in roster.students.values()
                       if s.lms_user_id}
        if name not in roster.students and name in by_platform:
            auth_model["name"] = name = by_platform[name]
        student = roster.students.get(name)
        if name in self.fixed or (student is not None and student.status == "active"):
            return auth_model
        if student is not None:
            raise HTTPError(403, f"{name} was retired from this course's class list on "
                            f"{student.since[:10]}: ask your instructor")
        raise HTTPError(403, f"{name} is not on this course's class list (the roster "
                        "`make hub-roster` keeps): ask your instructor")
