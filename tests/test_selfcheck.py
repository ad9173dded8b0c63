"""The learner's self-check (`make check MODULE=...`) gives the grader's verdict.

On the faultlab module (autograder/faults/faultlab/, released into a temporary folder): a
learner's notebook with one exercise right, one wrong whose test they edited to `pass`, and
one that never returns is reported per test as passed / FAILED with the check's message /
TIMED OUT; a deleted test cell is reported as DELETED (it scores 0 at grading); the command
line prints the table and says which notebook it checked; workspace/ is preferred to course/.
`standing()`, a notebook's last cell, prints the same table for the saved file, and skips
at once when a grading tool (nbgrader, the self-check itself, a test) runs the notebook.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import nbformat
import pytest
from conftest import ROOT
from grading_runs import FAULT_MODULE, FAULTS_DIR, full_answers

from parlab.grading import (
    SELFCHECK_ENV,
    generate_release,
    grade_id,
    learner_notebook,
    selfcheck,
    standing,
)

pytestmark = pytest.mark.slow
CELL_TIMEOUT_S = 5


@pytest.fixture(scope="module")
def released(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("selfcheck_root")
    shutil.copytree(FAULTS_DIR / FAULT_MODULE, root / "solutions" / FAULT_MODULE)
    generate_release(FAULT_MODULE, root=root)
    return root


def _learner(released: Path, folder: Path, **sources: str) -> Path:
    """alice's answers with some cells replaced (or deleted: source None), saved in folder."""
    nb = full_answers(released, FAULT_MODULE)
    for cell in nb.cells:
        cell.source = sources.get(grade_id(cell), cell.source)
    nb.cells = [c for c in nb.cells if c.source is not None]
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{FAULT_MODULE}.ipynb"
    nbformat.write(nb, str(path))
    return path


def _release(released: Path) -> Path:
    return released / "course" / FAULT_MODULE / f"{FAULT_MODULE}.ipynb"


def test_each_test_gets_the_graders_verdict(released: Path, tmp_path: Path) -> None:
    path = _learner(released, tmp_path / "workspace" / FAULT_MODULE,
                    double_answer="def double(x):\n    return x + 1",
                    double_test="pass  # edited to pass",
                    square_answer="def square(x):\n    while True:\n        pass")
    before = path.read_text()
    rows = {r.test: r for r in selfcheck(path, _release(released), timeout=CELL_TIMEOUT_S)}
    assert list(rows) == ["mean_test", "double_test", "square_test"]
    assert rows["mean_test"].verdict == "passed" and rows["mean_test"].message == ""
    assert rows["double_test"].verdict == "FAILED", rows["double_test"]
    assert "double(3) should be 6, got 4" in rows["double_test"].message, (
        "the edited test cell must run as released, as at grading")
    assert rows["square_test"].verdict == "TIMED OUT", rows["square_test"]
    assert f"after {CELL_TIMEOUT_S} s" in rows["square_test"].message
    assert path.read_text() == before, "self-check wrote to the learner's notebook"


def test_command_line_prints_a_table_and_reports_a_deleted_test(released: Path,
                                                                 tmp_path: Path) -> None:
    path = _learner(released, tmp_path / FAULT_MODULE, double_test=None)
    proc = subprocess.run(
        [sys.executable, "-m", "parlab.grading", "check", FAULT_MODULE, "--notebook", str(path),
         "--release", str(_release(released)), "--timeout", "20", "--strict"],
        cwd=ROOT, capture_output=True, text=True, timeout=300)
    out = proc.stdout
    assert proc.returncode == 1, f"--strict must fail when a test does not pass:\n{out}"
    assert f"Self-check of {path}" in out, out
    lines = {ln.split()[0]: ln for ln in out.splitlines() if ln.startswith("  ") and ln.split()}
    assert "passed" in lines["mean_test"] and "passed" in lines["square_test"], out
    assert "DELETED" in lines["double_test"] and "was deleted" in lines["double_test"], out
    assert "2 of 3 tests passed (3 of 4 points)" in out, out


def test_workspace_copy_is_preferred_to_the_release(tmp_path: Path) -> None:
    workspace, course = tmp_path / "workspace", tmp_path / "course"
    (course / "m").mkdir(parents=True)
    (course / "m" / "m.ipynb").write_text("{}")
    path, which = learner_notebook("m", workspace, course)
    assert path == course / "m" / "m.ipynb" and "blank release" in which and "make lab" in which
    (workspace / "m").mkdir(parents=True)
    (workspace / "m" / "m.ipynb").write_text("{}")
    path, which = learner_notebook("m", workspace, course)
    assert path == workspace / "m" / "m.ipynb" and which == "your working copy"


def test_an_unreadable_notebook_is_reported_not_run(tmp_path: Path) -> None:
    path = tmp_path / "m.ipynb"
    path.write_text('{"cells": [')
    rows = selfcheck(path)
    assert [r.verdict for r in rows] == ["UNREADABLE"], rows
    assert "JSON breaks at line 1" in rows[0].message, rows


# --- standing(): the self-check from the notebook's last cell ------------------------------------
def test_standing_skips_under_every_grading_tool(capsys) -> None:
    from parlab.grading.learner.in_notebook import skip_reason

    assert skip_reason({}) is None
    assert "nbgrader autograde" in skip_reason({"NBGRADER_EXECUTION": "autograde"})
    assert "nbgrader validate" in skip_reason({"NBGRADER_EXECUTION": "validate"})
    assert "self-check" in skip_reason({SELFCHECK_ENV: "1"})
    assert "test" in skip_reason({"PYTEST_CURRENT_TEST": "x"})
    start = time.perf_counter()
    standing("faultlab")  # under pytest: skipped at once
    assert time.perf_counter() - start < 1
    assert capsys.readouterr().out.startswith("standing(): skipped, this notebook is being run")


ENV_TEST = '''\
import contextlib, io, os
from parlab.grading import standing
shown = io.StringIO()
with contextlib.redirect_stdout(shown):
    standing()
assert os.environ.get("PARLAB_SELFCHECK") == "1", dict(os.environ)
assert shown.getvalue().startswith("standing(): skipped"), shown.getvalue()
'''


def test_the_self_checks_kernel_makes_standing_skip(tmp_path: Path) -> None:
    cell = nbformat.v4.new_code_cell(ENV_TEST, metadata={"nbgrader": {
        "grade": True, "solution": False, "locked": True, "points": 1, "grade_id": "env_test",
        "schema_version": 3}})
    path = tmp_path / "m" / "m.ipynb"
    path.parent.mkdir()
    nbformat.write(nbformat.v4.new_notebook(cells=[cell]), str(path))
    rows = selfcheck(path, timeout=60)
    assert [(r.test, r.verdict) for r in rows] == [("env_test", "passed")], rows


def test_standing_prints_the_table_for_the_saved_notebook(released: Path, tmp_path: Path) -> None:
    folder = tmp_path / "workspace" / FAULT_MODULE
    _learner(released, folder, double_answer="def double(x):\n    return x + 1")
    env = {k: v for k, v in os.environ.items()
           if k not in ("PYTEST_CURRENT_TEST", SELFCHECK_ENV, "NBGRADER_EXECUTION")}
    proc = subprocess.run([sys.executable, "-c", "from parlab.grading import standing; standing()"],
                          cwd=folder, env=env, capture_output=True, text=True, timeout=300)
    out = proc.stdout
    assert proc.returncode == 0, out + proc.stderr
    assert f"Checking the SAVED file {folder / (FAULT_MODULE + '.ipynb')}" in out, out
    assert "save the notebook first" in out
    # the table names the notebook it read, which the learner did not name
    assert f"Self-check of {folder / (FAULT_MODULE + '.ipynb')} (this notebook, as last " \
        "saved)" in out and "you named" not in out, out
    lines = {ln.split()[0]: ln for ln in out.splitlines() if ln.startswith("  ") and ln.split()}
    assert "passed" in lines["mean_test"] and "FAILED" in lines["double_test"], out
    assert "double(3) should be 6, got 4" in lines["double_test"], out
    assert "2 of 3 tests passed (3 of 4 points)" in out, out
