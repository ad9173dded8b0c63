"""The nbgrader round trip, release -> submit -> autograde -> gradebook: check (c).

The shared course run (tests/grading_runs.py, conftest's `course_run`) copies every module of
solutions/ plus the smoke fixture (tests/fixtures/, so the pipeline stays proven before and
beside the real modules) into a temporary course root, releases them all with the gradebook
on, submits a full-marks notebook built from the solutions for "alice" and the blank release
for "bob", and autogrades everything with the instructor's parallel pipeline
(`parlab.grading.autograde_parallel`, one nbgrader process per worker, merged into one gradebook).

(c) the sqlite gradebook: alice has the maximum, bob has 0, one submission row each with
    every notebook; the run left no process behind.
(a) and (b), what each notebook's cells did, are tests/test_notebooks.py.
"""

from __future__ import annotations

from collections import Counter

import pytest
from grading_runs import BLANK, FIXTURES_DIR, FULL

from parlab.grading import SOLUTIONS_DIR, graded_cell_errors, list_modules

pytestmark = pytest.mark.slow

MODULES = sorted(set(list_modules(SOLUTIONS_DIR)) | set(list_modules(FIXTURES_DIR)))


def test_no_module_has_a_fixture_name() -> None:
    assert not set(list_modules(SOLUTIONS_DIR)) & set(list_modules(FIXTURES_DIR)), (
        "a module in solutions/ has the name of a test fixture module")


def _why_not_full_marks(course_run, module: str) -> str:
    """The graded cells that failed in alice's autograded notebook, or the run's status."""
    graded = course_run.run.get(module, FULL)
    if graded.score is None:
        return graded.status
    errors = graded_cell_errors(course_run.autograded(FULL, module))
    return "\n".join(f"  {gid}: {err[0]}: {err[1][:200]}" for gid, err in errors.items() if err)


@pytest.mark.parametrize("module", MODULES)
def test_c_gradebook_has_full_marks_and_zero(course_run, module: str) -> None:
    from nbgrader.api import Gradebook

    full, blank = course_run.run.get(module, FULL), course_run.run.get(module, BLANK)
    assert full.max_score > 0, f"(c) {module} has no points in the gradebook"
    assert full.score == full.max_score, (
        f"(c) {module}: the solutions score {full.score} of {full.max_score} "
        f"(None = not graded):\n{_why_not_full_marks(course_run, module)}")
    assert blank.score == 0, (
        f"(c) {module}: the blank release scores {blank.score}: a test passes with no answer")
    with Gradebook(f"sqlite:///{course_run.root / 'gradebook.db'}", course_id="") as gb:
        rows = Counter(s.student.id for s in gb.assignment_submissions(module))
        notebooks = {s.student.id: len(s.notebooks) for s in gb.assignment_submissions(module)}
        expected_notebooks = len(gb.find_assignment(module).notebooks)
    assert rows == {FULL: 1, BLANK: 1}, f"(c) {module}: submission rows {dict(rows)}"
    assert set(notebooks.values()) == {expected_notebooks}, (
        f"(c) {module}: notebooks per submission {notebooks}, expected {expected_notebooks}")


def test_c_course_run_left_no_process_behind(course_run) -> None:
    assert course_run.run.leftover == [], (
        f"kernels or ranks outlived the autograde workers: {course_run.run.leftover}")
