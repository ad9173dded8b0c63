"""What the exchange records of each learner: fetched (kept here), handed in, feedback returned.

nbgrader's fetch copies a release from the exchange's `outbound/` into the learner's
workspace and leaves no trace the instructor can read (the workspace is the learner's alone).
`RecordedFetch` (set as `ExchangeFactory.fetch_assignment` in
autograder/hub/nbgrader/nbgrader_config.py) does nbgrader's fetch, then, as the learner, makes
an empty file `<exchange>/<course>/fetched/<student>+<module>+<random>` (one per fetch).
`fetched/` is made by root when the hub starts (`parlab.hub.exchange.prepare_exchange`):
`3773`, the instructors' group, as `inbound/`: a learner can add a file but not list the
folder, nor rename or remove another's file. The name says who and what; the file's owner
(the learner's Unix account, which nobody else can fake) and its time say who really did it
and when: `fetches` trusts a record only when its owner is the student it names. A record
that cannot be made (the hub started before this existed) is only a warning: the fetch itself
has happened.

The readers for the instructor's `make status` (parlab.grading.report.status): `fetches` (the
records above), `hand_ins` (the submissions in `inbound/`, as nbgrader's collect reads their
names) and `released_page` (where nbgrader's release_feedback puts a notebook's feedback page:
`feedback/<md5 of the submission's secret and the notebook's name>.html`); `exchange_course`
is the course's folder in the exchange, where the hub made one.
"""

from __future__ import annotations

import datetime as dt
import os
import pwd
import secrets
from dataclasses import dataclass
from pathlib import Path

from nbgrader.exchange.default.fetch_assignment import ExchangeFetchAssignment
from nbgrader.utils import get_username, notebook_hash, parse_utc

from parlab.hub.exchange import exchange_settings

__all__ = ["RecordedFetch", "Fetch", "fetches", "hand_ins", "released_page", "exchange_course",
           "FETCHED"]

FETCHED = "fetched"


class RecordedFetch(ExchangeFetchAssignment):
    """nbgrader's fetch, then a record of it in the exchange's `fetched/` (module docstring)."""

    def copy_files(self) -> None:
        super().copy_files()
        folder = Path(self.root) / self.coursedir.course_id / FETCHED
        name = f"{get_username()}+{self.coursedir.assignment_id}+{secrets.token_hex(6)}"
        try:
            fd = os.open(folder / name, os.O_CREAT | os.O_EXCL | os.O_WRONLY | os.O_NOFOLLOW,
                         0o640)
            os.close(fd)
        except OSError as exc:
            self.log.warning("fetched, but not recorded for the instructor (%s): the hub "
                             "makes %s when it starts", exc, folder)


@dataclass(frozen=True)
class Fetch:
    """A student's fetches of one module: the first and the last (naive UTC, as nbgrader's
    times), and how many."""

    first: dt.datetime
    last: dt.datetime
    count: int


def fetches(course: Path, module: str) -> dict[str, Fetch]:
    """The fetch records of `module` in the exchange's course folder `course`, by student;
    a record whose owner is not the student it names is left out (someone else made it)."""
    folder = Path(course) / FETCHED
    times: dict[str, list[dt.datetime]] = {}
    try:
        entries = list(os.scandir(folder))
    except OSError:
        return {}
    for entry in entries:
        parts = entry.name.split("+")
        if len(parts) != 3 or parts[1] != module:
            continue
        try:
            info = entry.stat(follow_symlinks=False)
            owner = pwd.getpwuid(info.st_uid).pw_name
        except (OSError, KeyError):
            continue
        if owner != parts[0]:
            continue
        when = dt.datetime.fromtimestamp(info.st_mtime, tz=dt.timezone.utc).replace(tzinfo=None)
        times.setdefault(owner, []).append(when)
    return {s: Fetch(min(t), max(t), len(t)) for s, t in times.items()}


def exchange_course() -> Path | None:
    """The course's folder in nbgrader's exchange (PARLAB_HUB_EXCHANGE, PARLAB_HUB_COURSE_ID,
    as for `make hub-collect`) where the hub made one; else None."""
    root, course = exchange_settings()
    folder = root / course
    return folder if (folder / "inbound").is_dir() else None


def hand_ins(course: Path, module: str) -> dict[str, list[dt.datetime]]:
    """Every submission of `module` in the exchange's inbound/, by student, oldest first (naive
    UTC), as nbgrader's collect reads their names: <student>+<module>+<time>[+<random>]."""
    found: dict[str, list[dt.datetime]] = {}
    try:
        names = os.listdir(Path(course) / "inbound")
    except OSError:
        return found
    for name in names:
        parts = name.rsplit("+", 3)
        if len(parts) < 3 or parts[1] != module:
            continue
        try:
            found.setdefault(parts[0], []).append(parse_utc(parts[2]))
        except (ValueError, OverflowError):
            continue
    return {s: sorted(t) for s, t in found.items()}


def released_page(course: Path, secret: str, notebook: str) -> Path:
    """Where nbgrader's release_feedback puts a notebook's feedback page for the submission
    whose submission_secret.txt holds `secret`."""
    return Path(course) / "feedback" / f"{notebook_hash(secret=secret, notebook_id=notebook)}.html"
