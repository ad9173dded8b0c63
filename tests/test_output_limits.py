"""Output limits (parlab.grading.autograde.outputs): a cell that prints too much is cut off and
scores 0.

Small notebooks run through ResilientExecute with a real kernel, with limits small enough to
pass in a second: many small prints, one huge string, a flood of flushed one-byte prints, and
cells each under the per-cell limit that together pass the notebook's. The stored outputs stay
within the limit, the cell gets an OutputLimit error naming the number, the cells before it are
untouched, and a later small cell still runs (the per-cell cases).
"""

from __future__ import annotations

import nbformat
import pytest

from parlab.grading import has_error
from parlab.grading.autograde.execute import ResilientExecute
from parlab.grading.autograde.outputs import OVERHEAD

CELL_LIMIT = 10_000
NOTEBOOK_LIMIT = 25_000
MARGIN = 2 * OVERHEAD  # the output that crossed may keep its wrapper; the error is not counted

NOTEBOOKS = {
    "many_prints": ["print('before')",
                    f"for i in range({10 * CELL_LIMIT // 10}):\n    print('x' * 9)",
                    "print('after')"],
    "one_string": ["print('before')", f"print('y' * {10 * CELL_LIMIT})", "print('after')"],
    "flushed": ["print('before')", "for i in range(2000):\n    print(1, flush=True)",
                "print('after')"],
    "displays": ["print('before')", "from IPython.display import display\n"
                 "for i in range(50):\n    display({'text/plain': 'z' * 1000}, raw=True)",
                 "print('after')"],
    "display_id": ["print('before')", "from IPython.display import display, update_display\n"
                   "for i in range(20):\n"
                   "    display({'text/plain': 's'}, raw=True, display_id='d')\n"
                   "update_display({'text/plain': 'w' * 5000}, raw=True, display_id='d')",
                   "print('after')"],
    "notebook": ["print('a' * 8_000)"] * 4 + ["print('after')"],
}


def _stored(cell) -> int:
    """Characters of text the cell's outputs store (all ASCII here: bytes)."""
    return sum(len(o.get("text", "")) + sum(len(v) for v in o.get("data", {}).values())
               for o in cell.outputs)


def _limit_errors(cell) -> list[str]:
    return [o.evalue for o in cell.outputs if o.get("ename") == "OutputLimit"]


@pytest.fixture(scope="module")
def graded(tmp_path_factory) -> dict[str, nbformat.NotebookNode]:
    executor = ResilientExecute(timeout=30, submission_timeout=120, warm_kernels=False,
                                cell_output_limit=CELL_LIMIT,
                                notebook_output_limit=NOTEBOOK_LIMIT)
    out = {}
    for name, sources in NOTEBOOKS.items():
        folder = tmp_path_factory.mktemp(name)
        nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(s) for s in sources])
        out[name], _ = executor.preprocess(nb, {"metadata": {"path": str(folder)}})
    return out


@pytest.mark.parametrize("name", ["many_prints", "one_string", "flushed", "displays",
                                  "display_id"])
def test_a_cell_past_its_limit_is_cut_and_scores_0(graded, name) -> None:
    before, flood, after = graded[name].cells
    assert [o.get("text") for o in before.outputs] == ["before\n"], before.outputs
    assert _stored(flood) <= CELL_LIMIT + MARGIN, _stored(flood)
    if name in ("many_prints", "one_string", "displays"):
        assert _stored(flood) > CELL_LIMIT // 2, "cut to fit, not dropped whole"
    if name == "flushed":  # 2 bytes a message, but each message counts OVERHEAD more
        assert _stored(flood) <= 2 * CELL_LIMIT // OVERHEAD, _stored(flood)
    assert _limit_errors(flood) == [
        "this cell printed more than 10,000 bytes (the grader's limit per cell); the rest was "
        "cut off and the cell scores 0. Print less: a summary, not every value."]
    assert flood.outputs[-1].ename == "OutputLimit", "the error comes after the cell's output"
    assert [o.get("text") for o in after.outputs] == ["after\n"] and not has_error(after)


def test_cells_under_the_cell_limit_together_pass_the_notebook_limit(graded) -> None:
    cells = graded["notebook"].cells
    assert sum(_stored(c) for c in cells) <= NOTEBOOK_LIMIT + MARGIN
    assert [bool(_limit_errors(c)) for c in cells] == [False, False, False, True, True]
    assert all(c.outputs[0].text == "a" * 8_000 + "\n" for c in cells[:3])
    assert "more than 25,000 bytes in all (the grader's limit per notebook)" in (
        _limit_errors(cells[3])[0])


def test_the_notebook_count_restarts_with_each_notebook(graded) -> None:
    # "notebook" ran last on the same executor, after four notebooks with ~10 kB each
    assert not _limit_errors(graded["notebook"].cells[0])
