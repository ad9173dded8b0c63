"""The instructor workflow, start to finish, and feedback that never shows a hidden test.

- The README's commands (autograder/README.md) through the entry point the make targets call
  (`python -m parlab.grading`, checked below to be what they run), on the fault run's
  course root (tests/grading_runs.py): the faultlab module released with a due date, the
  class of issue 15 handed in, in both layouts `collect` accepts; `collect --times`,
  `autograde --workers 3` (in the fixture), a second `autograde` that finds nothing new, a
  re-grade of one student with `--all` (no duplicated row, the others untouched), `export`
  to CSV (one row per student with the score, late penalty and status the class must get,
  in the columns the README describes) and `feedback`.
- Feedback: for the fault run and for the course run (every real module), every generated
  HTML file is searched for every hidden-test line of the module's source notebook; none may
  be found. nbgrader's own feedback (without parlab.grading.HideHiddenTests) is shown to
  leak them, so the search is known to find what it looks for.
"""

from __future__ import annotations

import csv
import subprocess

import nbformat
import pytest
from conftest import ROOT
from grading_runs import FAULT_ARGS, FAULT_MODULE, FAULTS_DIR, expected_class, instructor

from parlab.grading import GradeRun, distinctive_hidden_lines, leaks, run_nbgrader
from parlab.grading.report.export import COLUMNS

pytestmark = pytest.mark.slow
REGRADED = "fault-rank-raises"


@pytest.fixture(scope="module")
def workflow(fault_run) -> dict:
    """After the fault run's collect and autograde: re-grade one student, export, feedback."""
    root = fault_run.root
    before = GradeRun.load(root)
    steps = dict(fault_run.steps)
    steps["unchanged"] = instructor(root, "autograde", "--", *FAULT_ARGS)
    steps["regrade"] = instructor(root, "autograde", "--student", REGRADED, "--all", "--",
                                  *FAULT_ARGS)
    steps["export"] = instructor(root, "export", "--to", str(root / "grades.csv"))
    steps["feedback"] = instructor(root, "feedback")
    return {"root": root, "steps": steps, "before": before, "after": GradeRun.load(root)}


@pytest.mark.parametrize("step", ["duedate", "collect", "autograde", "unchanged", "regrade",
                                  "export", "feedback"])
def test_each_command_succeeds(workflow, step: str) -> None:
    proc = workflow["steps"][step]
    assert proc.returncode == 0, (f"`{step}` exited {proc.returncode}:\n{proc.stdout[-3000:]}"
                                  f"\n{proc.stderr[-3000:]}")


def test_collect_files_every_submission_in_both_layouts(fault_run) -> None:
    students = fault_run.students[FAULT_MODULE]
    for student in students:
        folder = fault_run.root / "submitted" / student / FAULT_MODULE
        assert (folder / f"{FAULT_MODULE}.ipynb").is_file(), f"not collected: {folder}"
        assert (folder / "timestamp.txt").is_file(), f"no timestamp: {folder}"
    out = fault_run.steps["collect"].stdout
    assert f"collected {len(students)} submissions" in out, out
    assert "unreadable notebook" in out, "collect should warn about the notebook it cannot read"


def test_regrade_updates_one_student_and_keeps_the_rest(workflow) -> None:
    before, after = workflow["before"], workflow["after"]
    assert [r.student for r in after.results] == [REGRADED]
    assert after.results[0].score == before.get(FAULT_MODULE, REGRADED).score


def test_a_rerun_without_changes_grades_nothing(workflow, fault_run) -> None:
    out = workflow["steps"]["unchanged"].stdout
    n = len(fault_run.students[FAULT_MODULE])
    assert "0 submissions graded" in out and f"{n} up to date" in out, out


def test_grades_csv_has_one_right_row_per_submission(workflow, fault_run) -> None:
    """Export: one row per student of the only released module, with the score, late penalty
    and status the class must get (grading_runs.expected_class)."""
    with open(workflow["root"] / "grades.csv", newline="") as f:
        rows = list(csv.DictReader(f))
    assert list(rows[0]) == COLUMNS, f"grades.csv columns {list(rows[0])}, README says {COLUMNS}"
    got = {r["student_id"]: (float(r["raw_score"]), float(r["late_submission_penalty"]),
                             r["status"]) for r in rows if r["assignment"] == FAULT_MODULE}
    expected = expected_class()
    assert len(rows) == len(got) == len(expected), f"grades.csv rows: {len(rows)}"
    wrong = {s: (got.get(s), want) for s, want in expected.items()
             if got.get(s) is None or got[s][2] != want[2]
             or any(abs(g - w) > 1e-9 for g, w in zip(got[s][:2], want[:2], strict=True))}
    assert not wrong, f"student: (grades.csv, expected):\n{wrong}"
    for r in rows:
        assert abs(float(r["score"]) - max(0.0, float(r["raw_score"])
                                           - float(r["late_submission_penalty"]))) < 1e-9, r


def _hidden(module_dir, module: str) -> set[str]:
    return distinctive_hidden_lines(
        nbformat.read(str(module_dir / f"{module}.ipynb"), as_version=4))


def test_fault_run_feedback_shows_no_hidden_test(workflow, fault_run) -> None:
    hidden = _hidden(FAULTS_DIR / FAULT_MODULE, FAULT_MODULE)
    assert hidden, "faultlab has no hidden test lines to look for"
    for student in fault_run.students[FAULT_MODULE]:
        html = workflow["root"] / "feedback" / student / FAULT_MODULE / f"{FAULT_MODULE}.html"
        assert html.is_file(), f"no feedback for {student} (withheld?)"
        found = leaks(html.read_text(), hidden)
        assert not found, f"feedback of {student} shows hidden tests: {found[:3]}"


def test_nbgrader_default_feedback_would_leak(workflow) -> None:
    """The search above can fail: without HideHiddenTests the same notebook leaks."""
    student = "fault-hidden-test-fails"
    run_nbgrader("generate_feedback", FAULT_MODULE, "--force",
                 f"--CourseDirectory.student_id={student}",
                 "--CourseDirectory.feedback_directory=raw",
                 '--GenerateFeedback.preprocessors=["nbgrader.preprocessors.GetGrades",'
                 '"nbconvert.preprocessors.CSSHTMLHeaderPreprocessor"]',
                 # and nbconvert's own exporter, not the course's FeedbackGuard, which would
                 # refuse to write the leaking page (parlab.grading.feedback.leakcheck)
                 "--GenerateFeedback.exporter_class=nbconvert.exporters.HTMLExporter",
                 root=workflow["root"])
    html = workflow["root"] / "raw" / student / FAULT_MODULE / f"{FAULT_MODULE}.html"
    assert leaks(html.read_text(), _hidden(FAULTS_DIR / FAULT_MODULE, FAULT_MODULE)), (
        "nbgrader's default feedback no longer leaks hidden tests?")


def test_course_feedback_shows_no_hidden_test(course_run) -> None:
    run_nbgrader("generate_feedback", "*", "--force", root=course_run.root)
    for module, src in course_run.sources.items():
        hidden = _hidden(src, module)
        for student in course_run.students[module]:
            html = course_run.root / "feedback" / student / module / f"{module}.html"
            assert html.is_file(), f"no feedback for {student}/{module}"
            found = leaks(html.read_text(), hidden)
            assert not found, f"feedback {student}/{module} shows hidden tests: {found[:3]}"


def test_make_targets_call_the_instructor_commands() -> None:
    proc = subprocess.run(["make", "-n", "collect", "FROM=inbox", "TIMES=t.csv", "autograde",
                           "MODULE=m", "STUDENT=s", "ALL=1", "WORKERS=4", "export", "feedback",
                           "report", "check"], cwd=ROOT, capture_output=True, text=True)
    lines = [ln for ln in proc.stdout.splitlines() if "parlab." in ln]
    assert lines == [
        '.venv/bin/python -m parlab.grading collect "inbox" --times "t.csv"',
        '.venv/bin/python -m parlab.grading autograde --module "m" --workers 4 --student "s" '
        '--all',
        ".venv/bin/python -m parlab.grading export --to grades.csv",
        '.venv/bin/python -m parlab.grading feedback --module "m"',
        ".venv/bin/python -m parlab.grading report --to report.html",
        ".venv/bin/python -m parlab.grading check m",
    ], proc.stdout + proc.stderr
