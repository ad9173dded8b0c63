"""What a learner sees in a notebook when a check fails: the message, and their own code only.

Module 02's released notebook runs in a real kernel (nbclient) up to its first test cell, with
the blank answer (the stub raises NotImplementedError in the ranks: it reads "not written
yet", as a stub reached in the kernel does, not as one rank's error); then the answer cell is
replaced by a wrong f (its backward forgets the all-reduce) and the test cell runs again. Each
failing test cell's error output must be at most 15 lines, name the learner's cell the way
IPython does ("Cell In[n]") or carry the "Likely mistake" line, and show no frame of parlab,
torch or the standard library.
"""

from __future__ import annotations

import copy
import re

import nbformat
import pytest
from conftest import ROOT
from nbclient import NotebookClient

MODULE = "02_tensor_parallel"
ANSI = re.compile(r"\x1b\[[0-9;]*m")


def _grade_id(cell) -> str:
    return cell.metadata.get("nbgrader", {}).get("grade_id", "")


def _wrong_f() -> str:
    sol = nbformat.read(ROOT / "solutions" / MODULE / f"{MODULE}.ipynb", as_version=4)
    answer = next(c.source for c in sol.cells if _grade_id(c) == "f_g_answer")
    answer = "\n".join(ln for ln in answer.splitlines() if "### " not in ln)
    assert "dist.all_reduce(grad)" in answer, "the solution's f changed: update this test"
    return answer.replace("dist.all_reduce(grad)", "pass")


@pytest.fixture(scope="module")
def failing_outputs() -> list[list[str]]:
    nb = nbformat.read(ROOT / "course" / MODULE / f"{MODULE}.ipynb", as_version=4)
    end = next(i for i, c in enumerate(nb.cells) if _grade_id(c) == "f_g_test")
    cells = nb.cells[:end + 1]
    wrong = copy.deepcopy(next(c for c in cells if _grade_id(c) == "f_g_answer"))
    wrong.source = _wrong_f()
    nb.cells = cells + [wrong, copy.deepcopy(cells[-1])]
    for i, cell in enumerate(nb.cells):
        cell["id"] = f"cell-{i}"
    NotebookClient(nb, timeout=120, allow_errors=True, kernel_name="python3",
                   resources={"metadata": {"path": str(ROOT / "course" / MODULE)}}).execute()
    outputs = []
    for cell in nb.cells:
        if cell.metadata.get("nbgrader", {}).get("grade"):
            errors = [o for o in cell.outputs if o.output_type == "error"]
            assert errors, f"test cell {cell.id} did not fail"
            outputs.append(ANSI.sub("", "\n".join(errors[0].traceback)).split("\n"))
    return outputs


@pytest.mark.slow
def test_a_failing_test_cell_shows_the_message_and_the_learners_cell(failing_outputs):
    stub, wrong = failing_outputs
    for lines in (stub, wrong):
        text = "\n".join(lines)
        assert len(lines) <= 15, f"{len(lines)} lines:\n{text}"
        assert "parlab/" not in text and "site-packages" not in text, text
        assert "Traceback (most recent call last)" not in text, text
    # every rank reached the stub: it reads as a stub in the kernel does, no rank named
    assert stub[0] == ("NotImplementedError: not written yet: Write your answer here, then run "
                       "the test cell below."), stub
    assert not any("rank" in ln for ln in stub), stub
    assert any(re.match(r"\s+Cell In\[\d+\], line \d+, in forward", ln) for ln in stub), stub
    assert any("raise NotImplementedError" in ln for ln in stub), stub
    assert wrong[0].startswith("CheckFailed: rank ")
    assert any(ln.startswith("Likely mistake: f's backward") for ln in wrong), wrong
