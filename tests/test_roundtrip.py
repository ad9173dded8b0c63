"""The nbgrader round trip, release -> submit -> autograde -> gradebook, for every module.

In a temporary course root (the real config, pointed elsewhere with --CourseDirectory.root):
copy solutions/<module> for every module plus the smoke fixture (tests/fixtures/, so the
pipeline stays proven before and beside the real modules), release them all with the gradebook
on, submit a full-marks notebook built from the solutions for "alice" and the blank release for
"bob", autograde everything in ONE nbgrader call, and read the sqlite gradebook: alice has the
maximum, bob has 0, one submission row each.
"""

from __future__ import annotations

import shutil
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

import nbformat
import pytest

from parlab.grading import (
    SOLUTIONS_DIR,
    AutogradeResult,
    NbgraderRun,
    autograde,
    fake_submission,
    generate_release,
    graded_cell_errors,
    list_modules,
)

pytestmark = pytest.mark.slow

FIXTURES_DIR = Path(__file__).parent / "fixtures"
SOURCES = {m: SOLUTIONS_DIR / m for m in list_modules(SOLUTIONS_DIR)}
SOURCES.update({m: FIXTURES_DIR / m for m in list_modules(FIXTURES_DIR)})
FULL_MARKS, BLANK = "alice", "bob"


@dataclass(frozen=True)
class GradedCourse:
    root: Path
    release: NbgraderRun
    result: AutogradeResult


@pytest.fixture(scope="module")
def graded(tmp_path_factory: pytest.TempPathFactory) -> GradedCourse:
    """Every module released, submitted by alice and bob, and autograded, in a temp root."""
    assert not set(list_modules(SOLUTIONS_DIR)) & set(list_modules(FIXTURES_DIR)), (
        "a module in solutions/ has the name of a test fixture module")
    root = tmp_path_factory.mktemp("course_root")
    for module, src in SOURCES.items():
        shutil.copytree(src, root / "solutions" / module,
                        ignore=shutil.ignore_patterns(".*", "__pycache__", "*.pyc"))
    release = generate_release("*", root=root, database=True)
    for module in SOURCES:
        released = root / "course" / module
        for student in (FULL_MARKS, BLANK):
            shutil.copytree(released, root / "submitted" / student / module)
        for notebook in released.glob("*.ipynb"):
            source = root / "solutions" / module / notebook.name
            nbformat.write(fake_submission(source, notebook),
                           root / "submitted" / FULL_MARKS / module / notebook.name)
    result = autograde(root, "*")
    print(f"\nnbgrader generate_assignment * (gradebook on), {len(SOURCES)} modules: "
          f"{release.seconds:.1f} s; nbgrader autograde *, {2 * len(SOURCES)} submissions: "
          f"{result.run.seconds:.1f} s (exit {result.run.returncode})")
    return GradedCourse(root, release, result)


def _why_not_full_marks(course: GradedCourse, module: str) -> str:
    """The graded cells that failed in alice's autograded notebooks, and nbgrader's log tail."""
    lines = []
    for path in sorted((course.root / "autograded" / FULL_MARKS / module).glob("*.ipynb")):
        errors = graded_cell_errors(nbformat.read(path, as_version=4))
        lines += [f"  {path.name} {gid}: {err[0]}: {err[1][:200]}"
                  for gid, err in errors.items() if err]
    return "\n".join(lines) or course.result.run.output[-3000:]


@pytest.mark.parametrize("module", sorted(SOURCES))
def test_roundtrip_scores(graded: GradedCourse, module: str) -> None:
    from nbgrader.api import Gradebook

    scores = graded.result.scores.get(module, {})
    maximum = graded.result.max_scores.get(module, 0.0)
    assert maximum > 0, f"{module} has no points in the gradebook"
    assert scores.get(FULL_MARKS) == maximum, (
        f"{module}: the solutions score {scores.get(FULL_MARKS)} of {maximum} "
        f"(None = submission dropped by nbgrader):\n{_why_not_full_marks(graded, module)}")
    assert scores.get(BLANK) == 0, (
        f"{module}: the blank release scores {scores.get(BLANK)}: a test passes with no answer")
    with Gradebook(f"sqlite:///{graded.root / 'gradebook.db'}", course_id="") as gb:
        rows = Counter(s.student.id for s in gb.assignment_submissions(module))
        notebooks = {s.student.id: len(s.notebooks) for s in gb.assignment_submissions(module)}
        expected_notebooks = len(gb.find_assignment(module).notebooks)
    assert rows == {FULL_MARKS: 1, BLANK: 1}, f"{module}: submission rows {dict(rows)}"
    assert set(notebooks.values()) == {expected_notebooks}, (
        f"{module}: notebooks per submission {notebooks}, expected {expected_notebooks}")
