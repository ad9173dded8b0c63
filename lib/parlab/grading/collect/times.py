"""When a submission was handed in, for nbgrader's late penalties (timestamp.txt).

nbgrader reads the submission time from `timestamp.txt` in the submission's folder and compares
it with the module's due date in the gradebook. Where a learning platform's download is the
source, the time comes, in this order, from: nbgrader's own timestamp.txt (kept as it is), a
CSV of submission times given to collect (`--times`), a date and time in the file's name
(`..._2026-03-01T17-05-00.ipynb`, `..._20260301-170500.ipynb`), and only then the file's
modification time, which a download usually resets: collect says so for each such file.
Times without a zone are taken as UTC.
"""

from __future__ import annotations

import csv
import datetime as dt
import re
from collections.abc import Sequence
from pathlib import Path

from dateutil import parser as dateparser

TIMESTAMP_FORMAT = "%Y-%m-%d %H:%M:%S.%f UTC"  # what nbgrader reads from timestamp.txt
STUDENT_COLUMNS = ("student", "student_id", "username", "user", "login", "identifier", "name")
TIME_COLUMNS = ("timestamp", "submitted", "submitted_at", "submission_time", "time",
                "last modified (submission)", "date")
MODULE_COLUMNS = ("module", "assignment", "assignment_id")
_IN_NAME = re.compile(r"(\d{4})-?(\d{2})-?(\d{2})[T _-]?(\d{2})[:.-]?(\d{2})(?:[:.-]?(\d{2}))?")


class TimesError(ValueError):
    """The CSV of submission times cannot be used; the message says what to change."""


def _utc(when: dt.datetime) -> dt.datetime:
    return when.replace(tzinfo=dt.timezone.utc) if when.tzinfo is None else when.astimezone(
        dt.timezone.utc)


def _column(header: Sequence[str], names: tuple[str, ...]) -> str | None:
    lowered = {h.strip().lower(): h for h in header}
    return next((lowered[n] for n in names if n in lowered), None)


def load_times(path: Path) -> dict[tuple[str, str], dt.datetime]:
    """{(student, module or ""): submission time, UTC} from a CSV with a header row."""
    with open(path, newline="", encoding="utf-8-sig") as f:
        reader = csv.DictReader(f)
        header = reader.fieldnames or []
        student, when = _column(header, STUDENT_COLUMNS), _column(header, TIME_COLUMNS)
        module = _column(header, MODULE_COLUMNS)
        if not student or not when:
            raise TimesError(f"{path}: needs a student column (one of {STUDENT_COLUMNS}) and a "
                             f"time column (one of {TIME_COLUMNS}); its header is {header}")
        times = {}
        for line, row in enumerate(reader, start=2):
            text = (row.get(when) or "").strip()
            if not text or text == "-":
                continue  # the platform's "no submission"
            try:
                parsed = dateparser.parse(text)
            except (ValueError, OverflowError) as exc:
                raise TimesError(f"{path}, line {line}: cannot read the time {text!r} ({exc}); "
                                 "write it as 2026-03-01 17:05:00+01:00") from None
            key = (row[student].strip(), (row.get(module) or "").strip() if module else "")
            times[key] = _utc(parsed)
        return times


def time_in_name(name: str) -> dt.datetime | None:
    """A date and time written in a file name (UTC), or None."""
    found = _IN_NAME.search(name)
    if not found:
        return None
    y, mo, d, h, mi, s = (int(g) if g else 0 for g in found.groups())
    try:
        return dt.datetime(y, mo, d, h, mi, s, tzinfo=dt.timezone.utc)
    except ValueError:
        return None


def submission_time(notebook: Path, names: tuple[str, ...], module: str,
                    times: dict[tuple[str, str], dt.datetime]) -> tuple[dt.datetime, str]:
    """(when, where that came from) for a notebook handed in under any of `names` (the
    student's folder name, and the id it is collected as)."""
    for name in names:
        for key in ((name, module), (name, "")):
            if key in times:
                return times[key], "the --times CSV"
    if (when := time_in_name(notebook.name)) is not None:
        return when, "the file's name"
    when = dt.datetime.fromtimestamp(notebook.stat().st_mtime, dt.timezone.utc)
    return when, ("the file's modification time (no timestamp.txt, no time in its name, no "
                  "--times entry; a download may have reset it)")


def write_timestamp(folder: Path, when: dt.datetime) -> None:
    """nbgrader's timestamp.txt for the submission in `folder`."""
    (folder / "timestamp.txt").write_text(_utc(when).strftime(TIMESTAMP_FORMAT))
