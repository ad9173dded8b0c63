"""A learner's work in progress survives a new release (parlab.grading.learner.workspace,
make update).

tests/data/previous_release_02_tensor_parallel.ipynb is module 02's notebook as released before
the library was restructured (its imports and text differ from today's). A learner's copy is made
from it with every answer cell filled (the current solutions, by grade id) and one cell of
their own. Then `stale` must name the module, and `update` must give the current release with
those answers in its answer cells, its own text and tests everywhere else, the learner's cell
at the end, and the old file kept as a backup.
"""

from __future__ import annotations

import subprocess
import sys

import nbformat
import pytest
from conftest import ROOT

from parlab.grading.base.cells import grade_id, is_answer_cell
from parlab.grading.learner import workspace

MODULE = "02_tensor_parallel"
OLD = ROOT / "tests" / "data" / f"previous_release_{MODULE}.ipynb"
MINE = "# my own scratch cell\nprint('trying f on one rank')"


def _answers() -> dict[str, str]:
    sol = nbformat.read(ROOT / "solutions" / MODULE / f"{MODULE}.ipynb", as_version=4)
    return {grade_id(c): "\n".join(ln for ln in c.source.splitlines() if "### " not in ln)
            for c in sol.cells if is_answer_cell(c)}


@pytest.fixture
def learner(tmp_path):
    """(workspace folder, course folder, the learner's answers by grade id)."""
    course = tmp_path / "course"
    (course / MODULE).mkdir(parents=True)
    (course / MODULE / f"{MODULE}.ipynb").write_bytes(
        (ROOT / "course" / MODULE / f"{MODULE}.ipynb").read_bytes())
    old = nbformat.read(OLD, as_version=4)
    answers = {gid: src for gid, src in _answers().items()
               if any(grade_id(c) == gid for c in old.cells)}
    for cell in old.cells:
        if is_answer_cell(cell) and grade_id(cell) in answers:
            cell.source = answers[grade_id(cell)]
    old.cells.insert(5, nbformat.v4.new_code_cell(MINE))
    (tmp_path / "workspace" / MODULE).mkdir(parents=True)
    nbformat.write(old, tmp_path / "workspace" / MODULE / f"{MODULE}.ipynb")
    return tmp_path / "workspace", course, answers


def test_an_older_copy_is_noticed_and_a_current_one_is_not(learner, tmp_path):
    folder, course, _ = learner
    assert workspace.stale(folder, course) == [MODULE]
    (tmp_path / "fresh" / MODULE).mkdir(parents=True)
    (tmp_path / "fresh" / MODULE / f"{MODULE}.ipynb").write_bytes(
        (course / MODULE / f"{MODULE}.ipynb").read_bytes())
    assert workspace.stale(tmp_path / "fresh", course) == []


def test_update_carries_every_answer_into_the_new_release(learner):
    folder, course, answers = learner
    before = (folder / MODULE / f"{MODULE}.ipynb").read_bytes()
    done = workspace.update(MODULE, workspace=folder, course=course)
    assert done.backup.read_bytes() == before  # the learner's file, untouched
    assert set(done.carried) == set(answers) and not done.dropped and done.added == 1
    new = nbformat.read(folder / MODULE / f"{MODULE}.ipynb", as_version=4)
    release = nbformat.read(course / MODULE / f"{MODULE}.ipynb", as_version=4)
    got = {grade_id(c): c.source for c in new.cells if is_answer_cell(c)}
    for gid, src in answers.items():
        assert got[gid] == src, f"answer {gid} was not carried over"
    fixed = [c.source for c in new.cells[:len(release.cells)] if not is_answer_cell(c)]
    assert fixed == [c.source for c in release.cells if not is_answer_cell(c)]
    assert new.cells[-1].source == MINE  # the learner's own cell, at the end
    assert workspace.stale(folder, course) == []  # up to date now


def test_the_command_line_reports_and_refuses_clearly(learner, tmp_path):
    folder, _, answers = learner
    grading = [sys.executable, "-m", "parlab.grading", "--root", str(tmp_path)]
    said = subprocess.run(grading + ["stale"], capture_output=True, text=True, check=True)
    assert f"make update MODULE={MODULE}" in said.stdout
    done = subprocess.run(grading + ["update", MODULE], capture_output=True, text=True)
    assert done.returncode == 0 and f"{len(answers)} answers carried" in done.stdout
    wrong = subprocess.run(grading + ["update", "99_nothing"], capture_output=True, text=True)
    assert wrong.returncode == 2 and "no released module '99_nothing'" in wrong.stderr
