"""The class of issue 15's "Why", graded with the README's commands alone (one shared run).

The fault run (tests/grading_runs.py) is that class: the fake class (alice full, bob blank,
carol half right), every fault corpus entry (deadlock, os._exit, endless loop, deleted and
edited test cells, not JSON, ...), a renamed file, a non-ASCII name, a notebook saved with its
outputs, and a late one. Its scores and grades.csv are checked in test_instructor.py and
test_faults.py; here:

- collect matched the renamed and non-ASCII files by their cells and took each submission
  time from the right source (timestamp.txt, the CSV, the file name, or said it was the
  file's modification time);
- the class report (`report`) shows every test's pass rate as computed here from the class
  list, the score histogram, and the one diagnosis the class earned;
- a re-run after one new and one changed submission grades those two notebooks only (counted
  in nbgrader's log), keeps every other record, autograded notebook and score, and reports a
  module folder without its notebook as MISSING instead of handing it to nbgrader.
"""

from __future__ import annotations

import datetime as dt
import json
import re
import shutil

import nbformat
import pytest
from grading_runs import (
    CAROL,
    DUE,
    FAULT_ARGS,
    FAULT_MODULE,
    FULL,
    LATE,
    LATE_BY,
    NAME_TIME,
    NON_ASCII_ID,
    POINTS,
    RENAMED,
    expected_class,
    full_answers,
    instructor,
    load_attacks,
    load_faults,
)
from nbgrader.utils import parse_utc

from parlab.grading import GradeRun
from parlab.grading.engines.record import load_record

pytestmark = pytest.mark.slow


def _collect_notes(fault_run) -> dict[str, str]:
    out = fault_run.steps["collect"].stdout
    return {ln.split()[0]: ln for ln in out.splitlines() if f" {FAULT_MODULE} " in ln}


def _timestamp(root, student: str) -> dt.datetime:
    text = (root / "submitted" / student / FAULT_MODULE / "timestamp.txt").read_text()
    return parse_utc(text).replace(tzinfo=dt.timezone.utc)


def test_collect_matches_files_by_their_cells_and_says_where_times_come_from(fault_run):
    notes = _collect_notes(fault_run)
    assert "'faultlab (1).ipynb' matched by its cells" in notes[RENAMED], notes[RENAMED]
    assert f"collected as '{NON_ASCII_ID}'" in notes[NON_ASCII_ID], notes[NON_ASCII_ID]
    assert "from the file's name" in notes[NON_ASCII_ID], notes[NON_ASCII_ID]
    assert "from the --times CSV" in notes[LATE], notes[LATE]
    assert "from the file's modification time" in notes[FULL], notes[FULL]
    assert "submitted at its timestamp.txt" not in notes[FULL]
    assert _timestamp(fault_run.root, NON_ASCII_ID) == NAME_TIME
    assert _timestamp(fault_run.root, LATE) == DUE + LATE_BY
    assert fault_run.steps["duedate"].returncode == 0, fault_run.steps["duedate"].stderr


@pytest.fixture(scope="module")
def report(fault_run, tmp_path_factory) -> dict:
    path = tmp_path_factory.mktemp("report") / "report.html"
    proc = instructor(fault_run.root, "report", "--to", str(path))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return {"stdout": proc.stdout, "html": path.read_text(encoding="utf-8")}


def _expected_pass_rates() -> dict[str, float]:
    """Each test's share of the class with full points, from the class list alone."""
    failed = {s: set() for s in expected_class()}
    failed["bob"] = set(POINTS)
    failed[CAROL] = {"mean_test"}
    for fault in load_faults():
        failed[fault.student] = set(fault.expect)
    for attack in load_attacks():  # the blank release, with an attack in its answers
        failed[attack.student] = set(POINTS)
    return {t: sum(t not in f for f in failed.values()) / len(failed) for t in POINTS}


def test_report_shows_each_tests_pass_rate(report) -> None:
    printed = {m.group(1): float(m.group(2)) for m in re.finditer(
        r"^\s+(\w+_test)\s+(\d+)% pass", report["stdout"], re.MULTILINE)}
    expected = {t: round(100 * r) for t, r in _expected_pass_rates().items()}
    assert printed == expected, f"report says {printed}, the class list gives {expected}"
    for test, rate in expected.items():
        assert re.search(rf"<td>{test}</td><td>[\d.]+</td><td>{rate}%</td>", report["html"]), (
            f"report.html lacks the row of {test} at {rate}%")


def test_report_has_a_histogram_and_counts_the_diagnoses(report) -> None:
    assert "data:image/png;base64,iVBOR" in report["html"], "no score histogram (PNG) inline"
    assert "likely mistake, 1x in mean_test: return the tensor you computed" in (
        report["stdout"]), report["stdout"]
    assert "<td>1</td><td>mean_test</td><td>return the tensor you computed</td>" in (
        report["html"])
    graded = len(expected_class())
    assert f"{FAULT_MODULE}: {graded} graded (0 not)" in report["stdout"], report["stdout"]


# --- incremental re-grading, in a copy of the class ---------------------------------------------
NEWCOMER, GHOST = "newcomer", "ghost"


@pytest.fixture(scope="module")
def rerun(fault_run, tmp_path_factory) -> dict:
    """A copy of the graded class; then one new student, carol's fixed notebook, and a
    module folder with no notebook; collect and autograde (incremental) once more."""
    root = tmp_path_factory.mktemp("rerun") / "course"
    shutil.copytree(fault_run.root, root, symlinks=True)
    inbox = tmp_path_factory.mktemp("rerun_inbox")
    full = nbformat.writes(full_answers(root, FAULT_MODULE))
    for student in (NEWCOMER, CAROL):
        (inbox / student).mkdir()
        (inbox / student / f"{FAULT_MODULE}.ipynb").write_text(full)
    (root / "submitted" / GHOST / FAULT_MODULE).mkdir(parents=True)
    (root / "submitted" / GHOST / FAULT_MODULE / "notes.txt").write_text("no notebook here")
    graded = sorted((root / "autograded").glob(f"*/{FAULT_MODULE}/{FAULT_MODULE}.ipynb"))
    before = {p: p.stat().st_mtime_ns for p in graded}
    record = load_record(root)
    steps = {"collect": instructor(root, "collect", str(inbox)),
             "autograde": instructor(root, "autograde", "--", *FAULT_ARGS)}
    return {"root": root, "steps": steps, "mtimes": before, "record": record,
            "run": GradeRun.load(root), "after": load_record(root)}


def test_rerun_grades_only_the_new_and_changed_notebooks(rerun) -> None:
    run = rerun["run"]
    executed = [ln for log in run.logs for ln in log.splitlines()
                if "] Autograding " in ln]
    assert len(executed) == 2, f"notebooks executed by the re-run: {executed}"
    assert {r.student for r in run.results} == {NEWCOMER, CAROL, GHOST}
    assert run.get(FAULT_MODULE, NEWCOMER).score == 4.0
    assert run.get(FAULT_MODULE, CAROL).score == 4.0, "carol's changed notebook not re-graded"
    assert len(run.unchanged) == len(expected_class()) - 1


def test_a_folder_without_its_notebook_is_reported_missing(rerun) -> None:
    ghost = rerun["run"].get(FAULT_MODULE, GHOST)
    assert ghost.score is None and ghost.status.startswith("MISSING: submitted/ghost/"), ghost
    assert "nbgrader" not in ghost.status.lower(), ghost.status
    assert rerun["steps"]["autograde"].returncode == 1, "a missing notebook must fail the run"
    assert "MISSING" in rerun["steps"]["autograde"].stdout


def test_rerun_keeps_every_other_record_and_notebook(rerun) -> None:
    before, after = rerun["record"], rerun["after"]
    changed = {f"{FAULT_MODULE}/{s}" for s in (NEWCOMER, CAROL, GHOST)}
    assert set(after) == set(before) | changed
    kept = {k: v for k, v in before.items() if k not in changed}
    assert {k: after[k] for k in kept} == kept, "the re-run rewrote records it did not grade"
    for path, mtime in rerun["mtimes"].items():
        if path.parts[-3] != CAROL:
            assert path.stat().st_mtime_ns == mtime, f"{path} was written again"
    last = json.loads((rerun["root"] / "autograded" / ".parlab" / "last_run.json").read_text())
    assert {r["student"] for r in last["results"]} == {NEWCOMER, CAROL, GHOST}
