"""`make export FORMAT=canvas` and `FORMAT=moodle`: the CSV each platform's gradebook imports,
read back as the platform reads it, header by header.

The class is the fault run's (tests/grading_runs.py: faultlab graded for real, a due date, a
late student with nbgrader's late penalty), in a copy of its course root with a class list
from "Moodle" run through `python -m parlab.hub.enrol` (what `make hub-roster` runs; the
trial: no Unix accounts) twice: alice, frank (late), carol and a new dora; then without carol,
who is retired. Each export runs through nbgrader's own `nbgrader export --exporter=...`.

What each cell must hold is computed here from grading_runs.expected_class() (raw score and
the late penalty from the due date, 0.1 of the score per started day) and the points of the
faultlab module, never read from our output. The readers follow each platform's parser:
Canvas's app/models/gradebook_importer.rb (header row, Points Possible row, students found by
ID, SIS User ID, SIS Login ID, then name) and Moodle's grade/import/csv/classes/load_data.php
(a mapped user column whose every value must be a user, a number or "-" per grade item, at
most gradepointmax); each fails on a header it would refuse (test_the_readers_refuse...).
"""

from __future__ import annotations

import csv
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import ROOT
from grading_runs import CAROL, FAULT_MODULE, FULL, LATE, POINTS, expected_class
from nbgrader.api import Gradebook

from parlab.grading.base.runner import run_nbgrader

pytestmark = pytest.mark.slow
CLASS = {FULL: ("Alice", "Ng", "alice@example.edu", "9001"),
         LATE: ("Frank", "Ødegård", "frank@example.edu", "9002"),
         CAROL: ("Carol", "Diaz", "carol@example.edu", "9003"),
         "dora": ("Dora", "Maar", "dora@example.edu", "9004")}
MAX = sum(POINTS.values())          # the faultlab module's points


def enrol(root: Path, students: dict) -> str:
    roster = root / "class.csv"
    with open(roster, "w", newline="", encoding="utf-8") as f:   # Moodle's participants export
        writer = csv.writer(f)
        writer.writerow(["ID", "Username", "First name", "Last name", "Email address"])
        writer.writerows([v[3], k, v[0], v[1], v[2]] for k, v in students.items())
    proc = subprocess.run([sys.executable, "-m", "parlab.hub.enrol", str(roster)],
                          env={**os.environ, "PARLAB_COURSE_ROOT": str(root),
                               "PARLAB_HUB_SYSTEM_USERS": "0"},
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return proc.stdout


@pytest.fixture(scope="module")
def exported(fault_run, tmp_path_factory) -> dict:
    root = tmp_path_factory.mktemp("platforms")
    for name in ("autograded", "submitted"):
        shutil.copytree(fault_run.root / name, root / name)
    shutil.copy(fault_run.root / "gradebook.db", root / "gradebook.db")
    enrol(root, CLASS)
    said = enrol(root, {k: v for k, v in CLASS.items() if k != CAROL})
    files = {}
    for fmt, plugin in (("canvas", "parlab.grading.report.canvas.CanvasExport"),
                        ("moodle", "parlab.grading.report.moodle.MoodleExport")):
        files[fmt] = root / f"grades-{fmt}.csv"
        run = run_nbgrader("export", f"--exporter={plugin}", "--to", str(files[fmt]), root=root)
        files[f"{fmt}-log"] = run.output
    return {"root": root, "files": files, "enrol": said}


def expected_scores() -> dict[str, float]:
    """student -> score less the late penalty, from the fault run's expected class; dora, who
    handed nothing in, 0; carol retired (not exported)."""
    want = {s: max(0.0, raw - penalty) for s, (raw, penalty, _) in expected_class().items()}
    want["dora"] = 0.0
    del want[CAROL]
    return want


# --- Canvas: app/models/gradebook_importer.rb, as a reader -----------------------------------

class InvalidHeaderRow(ValueError):
    pass


NON_ASSIGNMENT = re.compile("Current Score|Current Points|Current Grade|Final Score|Final Points"
                            "|Final Grade|Override Score|Override Grade|Override Status")


def canvas_import(path: Path, course: list[dict]) -> tuple[dict[str, float], dict]:
    """({assignment: points}, {canvas user: {assignment: grade or None}}) as Canvas reads
    `path` into a course of `course` students (id, sis_user_id, login, name, sortable_name)."""
    rows = list(csv.reader(open(path, newline="", encoding="utf-8")))
    header = rows[0]
    if not (len(header) > 3 and "Student" in header[0] and "ID" in header[1]):
        raise InvalidHeaderRow(f"not a student header: {header[:3]}")
    student_columns, sis_col, login_col = 3, None, None
    if re.search(r"SIS\s+Login\s+ID", header[2]):
        student_columns, login_col = 4, 2
    elif re.search(r"SIS\s+User\s+ID", header[2]) and re.search(r"SIS\s+Login\s+ID", header[3]):
        student_columns, sis_col, login_col = 5, 2, 3
    if "Section" not in header[student_columns - 1]:
        raise InvalidHeaderRow(f"no Section as the last student column: {header[:6]}")
    assignments = [(i, h) for i, h in enumerate(header) if i >= student_columns
                   and not NON_ASSIGNMENT.search(h)]
    points: dict[str, float] = {}
    grades: dict = {}
    for row in rows[1:]:
        if row and "Points Possible" in row[0]:
            points = {h: float(row[i]) for i, h in assignments if row[i]}
            continue
        by = [("id", row[1]), ("sis_user_id", row[sis_col] if sis_col else ""),
              ("login", row[login_col] if login_col is not None else "")]
        found = next((s for key, value in by if value for s in course if s[key] == value), None)
        found = found or next((s for s in course if row[0] in (s["name"], s["sortable_name"])),
                              None)
        assert found is not None, f"Canvas finds no student for the row {row}"
        cells = {h: row[i].strip() for i, h in assignments}
        grades[found["login"]] = {h: None if v in ("", "-") else float(v.replace(",", "."))
                                  for h, v in cells.items()}
    return points, grades


def canvas_course() -> list[dict]:
    """The Canvas course: the class list's students by their Canvas ID (and no SIS User ID),
    every other student of the gradebook by login only."""
    course = [{"id": v[3], "sis_user_id": "", "login": k, "name": f"{v[0]} {v[1]}",
               "sortable_name": f"{v[1]}, {v[0]}"} for k, v in CLASS.items()]
    course += [{"id": "", "sis_user_id": "", "login": s, "name": s, "sortable_name": s}
               for s in expected_class() if s not in CLASS]
    return course


def test_canvas_imports_every_grade_less_the_late_penalty(exported) -> None:
    points, grades = canvas_import(exported["files"]["canvas"], canvas_course())
    assert points == {FAULT_MODULE: MAX}
    want = expected_scores()
    got = {s: g[FAULT_MODULE] for s, g in grades.items()}
    assert set(got) == set(want), f"students: {sorted(set(got) ^ set(want))}"
    wrong = {s: (got[s], w) for s, w in want.items() if abs(got[s] - w) > 1e-9}
    assert not wrong, f"student: (Canvas reads, expected) {wrong}"
    assert abs(got[LATE] - MAX * (1 - 0.2)) < 1e-9       # 36 h late: two started days, 20 %


def test_canvas_rows_carry_the_class_list(exported) -> None:
    """Alice's row: Canvas's sortable name, her Canvas ID from the class list, her login."""
    rows = {r["SIS Login ID"]: r for r in csv.DictReader(open(exported["files"]["canvas"]))}
    assert rows[FULL]["Student"] == "Ng, Alice" and rows[FULL]["ID"] == "9001"
    assert rows[LATE]["Student"] == "Ødegård, Frank"
    assert CAROL not in rows and "carol" in exported["files"]["canvas-log"]


# --- Moodle: grade/import/csv/classes/load_data.php, as a reader ------------------------------

class ImportStopped(ValueError):
    pass


def moodle_import(path: Path, users: dict[str, dict], map_from: str, map_to: str,
                  items: list[str], gradepointmax: float = 100.0) -> dict:
    """{username: {item: grade or None}} as Moodle's CSV import reads `path` with column
    `map_from` mapped to the user field `map_to` and the columns `items` to new grade items."""
    rows = list(csv.reader(open(path, newline="", encoding="utf-8")))
    header = [h.strip() for h in rows[0]]
    if map_from not in header:
        raise ImportStopped(f"no column {map_from!r} to map users from: {header}")
    missing = [i for i in items if i not in header]
    if missing:
        raise ImportStopped(f"no grade item columns {missing}: {header}")
    out: dict = {}
    for line in rows[1:]:
        if len(line) <= 1:
            continue
        value = line[header.index(map_from)].strip()
        user = next((u for u, f in users.items() if value and f[map_to] == value), None)
        if user is None:
            raise ImportStopped(f"no user with {map_to} {value!r}: the whole import stops")
        grades = {}
        for item in items:
            text = line[header.index(item)].strip()
            if text == "-":
                grades[item] = None
                continue
            try:
                grades[item] = float(text)
            except ValueError:
                raise ImportStopped(f"{item}: not a grade: {text!r}") from None
            if grades[item] > gradepointmax:
                raise ImportStopped(f"{item}: {text} is over gradepointmax {gradepointmax}")
        out[user] = grades
    return out


def moodle_users() -> dict[str, dict]:
    users = {k: {"username": k, "useremail": v[2]} for k, v in CLASS.items()}
    users.update({s: {"username": s, "useremail": ""} for s in expected_class() if s not in CLASS})
    return users


def test_moodle_imports_every_grade_less_the_late_penalty(exported) -> None:
    got = moodle_import(exported["files"]["moodle"], moodle_users(), "Username", "username",
                        [FAULT_MODULE])
    want = expected_scores()
    assert set(got) == set(want), f"students: {sorted(set(got) ^ set(want))}"
    wrong = {s: (got[s][FAULT_MODULE], w) for s, w in want.items()
             if abs(got[s][FAULT_MODULE] - w) > 1e-9}
    assert not wrong, f"student: (Moodle reads, expected) {wrong}"


def test_moodle_by_email_finds_the_class_list(exported) -> None:
    """Mapped by email, the rows of students without one (never on the class list) stop
    Moodle's import, and the exporter said so; the class list's own rows have theirs."""
    rows = list(csv.DictReader(open(exported["files"]["moodle"], encoding="utf-8")))
    by_email = {r["Email address"]: r["Username"] for r in rows if r["Email address"]}
    assert by_email == {v[2]: k for k, v in CLASS.items() if k != CAROL}
    with pytest.raises(ImportStopped, match="no user with useremail ''"):
        moodle_import(exported["files"]["moodle"], moodle_users(), "Email address",
                      "useremail", [FAULT_MODULE])
    assert "map Moodle's user from Username" in exported["files"]["moodle-log"]


def test_the_readers_refuse_what_the_platforms_refuse(exported, tmp_path) -> None:
    """Each reader fails on a header its platform refuses: Section not last of the student
    columns (Canvas), a module's column missing or named otherwise (Moodle)."""
    rows = list(csv.reader(open(exported["files"]["canvas"], encoding="utf-8")))
    for broken in (["Student", "ID", "SIS Login ID", "SIS User ID", "Section"],
                   ["Name", "ID", "SIS User ID", "SIS Login ID", "Section"],
                   ["Student", "ID", "SIS User ID", "SIS Login ID", "Group"]):
        bad = tmp_path / "bad.csv"
        with open(bad, "w", newline="") as f:
            csv.writer(f).writerows([broken + rows[0][5:], *rows[1:]])
        with pytest.raises(InvalidHeaderRow):
            canvas_import(bad, canvas_course())
    with pytest.raises(ImportStopped, match="grade item"):
        moodle_import(exported["files"]["moodle"], moodle_users(), "Username", "username",
                      ["faultlab (points)"])


def test_the_roster_kept_every_grade(exported) -> None:
    """The second class list retired carol: her graded submission stays in the gradebook with
    her score, and the class list's names and platform ids are nbgrader's students'."""
    assert "retired:   carol (1 graded submissions kept)" in exported["enrol"], exported["enrol"]
    with Gradebook(f"sqlite:///{exported['root'] / 'gradebook.db'}") as gb:
        assert gb.find_submission(FAULT_MODULE, CAROL).score == expected_class()[CAROL][0]
        frank = gb.find_student(LATE)
        assert (frank.first_name, frank.last_name, frank.email, frank.lms_user_id) == (
            "Frank", "Ødegård", "frank@example.edu", "9002")


def test_make_export_format_runs_the_plugins() -> None:
    lines = {fmt: subprocess.run(["make", "-n", "export", f"FORMAT={fmt}"], cwd=ROOT,
                                 capture_output=True, text=True).stdout
             for fmt in ("canvas", "moodle")}
    assert "nbgrader export --exporter=parlab.grading.report.canvas.CanvasExport" in \
        lines["canvas"] and "grades-canvas.csv" in lines["canvas"], lines
    assert "--exporter=parlab.grading.report.moodle.MoodleExport" in lines["moodle"], lines
    refused = subprocess.run(["make", "-s", "export", "FORMAT=blackboard"], cwd=ROOT,
                             capture_output=True, text=True)
    assert refused.returncode != 0 and "FORMAT is canvas or moodle" in refused.stdout
