"""Reading nbgrader's marks on a notebook's cells, and the errors the cells ended with."""

from __future__ import annotations

import copy

import nbformat
from nbformat import NotebookNode
from nbgrader.preprocessors import ClearHiddenTests

META = "parlab"  # our key in notebook and cell metadata


def _nbgrader_meta(cell: NotebookNode) -> dict:
    return cell.get("metadata", {}).get("nbgrader", {})


def is_answer_cell(cell: NotebookNode) -> bool:
    """A cell the learner writes in (nbgrader `solution: true`)."""
    return bool(_nbgrader_meta(cell).get("solution", False))


def is_graded_cell(cell: NotebookNode) -> bool:
    """A cell that carries points (nbgrader `grade: true`)."""
    return bool(_nbgrader_meta(cell).get("grade", False))


def after_last_graded(cells: list[NotebookNode]) -> int:
    """One past the last graded cell (all of them when none is): what the grader runs of a
    notebook with ResilientExecute.skip_after_last_test."""
    graded = [i for i, cell in enumerate(cells) if is_graded_cell(cell)]
    return graded[-1] + 1 if graded else len(cells)


def grade_id(cell: NotebookNode) -> str | None:
    """The cell's nbgrader grade_id, or None for a cell nbgrader does not track."""
    return _nbgrader_meta(cell).get("grade_id")


def has_error(cell: NotebookNode) -> bool:
    """Whether the cell's outputs hold an error."""
    return any(o.get("output_type") == "error" for o in cell.get("outputs", []))


def cell_error(cell: NotebookNode) -> tuple[str, str] | None:
    """(ename, evalue) of the last error a code cell raised, or None."""
    errors = [o for o in cell.get("outputs", []) if o.get("output_type") == "error"]
    return (errors[-1].ename, errors[-1].evalue) if errors else None


def graded_cell_errors(nb: NotebookNode) -> dict[str, tuple[str, str] | None]:
    """For every graded code cell, by grade_id: the (ename, evalue) it ended with, or None."""
    return {str(grade_id(c)): cell_error(c) for c in nb.cells
            if c.cell_type == "code" and is_graded_cell(c)}


def error_output(ename: str, evalue: str) -> NotebookNode:
    """An error output as a kernel would record it, with a one-line traceback."""
    return nbformat.v4.new_output("error", ename=ename, evalue=evalue,
                                  traceback=[f"{ename}: {evalue}"])


def restored(cell: NotebookNode) -> str | None:
    """'edited' or 'deleted' when the grader had to put this test cell back."""
    return cell.get("metadata", {}).get(META, {}).get("restored")


def released_source(cell: NotebookNode) -> str:
    """A cell's source as generate_assignment releases it: without its hidden tests."""
    shadow = copy.deepcopy(cell)
    ClearHiddenTests(enforce_metadata=False)._remove_hidden_test_region(shadow)
    return shadow.source
