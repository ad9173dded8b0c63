"""Module notebooks execute the way learners and the autograder run them.

(a) Every solutions/ notebook runs top to bottom with no error in any cell, hidden tests
    included (they are plain code in the source), and leaves no file behind in its folder
    (`make release` would ship it to learners).
(b) Every course/ notebook, unanswered, runs to the end within a bound; every graded cell
    fails with a readable error (NotImplementedError from the stub, AssertionError, parlab's
    RankError / CheckFailed, ...), never by a timeout or a dead kernel.
Each notebook runs in a fresh kernel with its own folder as the working directory.
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from parlab.grading import (
    COURSE_DIR,
    SOLUTIONS_DIR,
    cell_error,
    execute_notebook,
    grade_id,
    graded_cell_errors,
    list_modules,
)

# nbgrader's per-cell limit (autograder/nbgrader_config.py, Execute.timeout): a cell that needs
# longer would be cut off by the autograder too.
CELL_TIMEOUT_S = 60
# An unanswered notebook fails fast at every exercise; this bound catches hangs, not slowness
# (DESIGN.md's 90 s per answered notebook is measured in benchmarks/, not asserted here).
UNANSWERED_BOUND_S = 300
# Errors that mean "the cell never finished", which a learner cannot act on. parlab's own
# CollectiveTimeout is readable, but an unanswered exercise must fail at once, not after the
# launcher's timeout, so it is rejected here as well.
NOT_READABLE = {"CellTimeoutError", "DeadKernelError", "KeyboardInterrupt", "TimeoutError",
                "CollectiveTimeout"}
NO_MODULES = "{} has no module yet (remove once module 00 lands)"


def _params(modules: list[str], top: Path) -> list:
    if modules:
        return modules
    return [pytest.param(None, marks=pytest.mark.skip(reason=NO_MODULES.format(top.name + "/")))]


def _notebooks(folder: Path) -> list[Path]:
    found = sorted(p for p in folder.glob("*.ipynb"))
    assert found, f"{folder} holds no notebook"
    return found


def _label(cell, index: int) -> str:
    gid = grade_id(cell)
    return f"cell {index}" + (f" ({gid})" if gid else "")


def _snapshot(folder: Path) -> set[str]:
    return {str(p.relative_to(folder)) for p in folder.rglob("*")
            if not any(part.startswith(".") or part == "__pycache__"
                       for part in p.relative_to(folder).parts)}


@pytest.mark.slow
@pytest.mark.parametrize("module", _params(list_modules(SOLUTIONS_DIR), SOLUTIONS_DIR))
def test_solution_notebook_runs_without_errors(module: str) -> None:
    folder = SOLUTIONS_DIR / module
    for path in _notebooks(folder):
        before = _snapshot(folder)
        nb = execute_notebook(path, timeout=CELL_TIMEOUT_S, cwd=folder)
        failures = [f"{_label(cell, i)}: {err[0]}: {err[1][:300]}"
                    for i, cell in enumerate(nb.cells)
                    if cell.cell_type == "code" and (err := cell_error(cell))]
        assert not failures, f"solutions/{module}/{path.name} fails:\n" + "\n".join(failures)
        left = sorted(_snapshot(folder) - before)
        assert not left, (f"solutions/{module}/{path.name} wrote {left} into its folder; "
                          "`make release` would copy them to learners (write to a temp dir)")


@pytest.mark.slow
@pytest.mark.parametrize("module", _params(list_modules(COURSE_DIR), COURSE_DIR))
def test_unanswered_release_fails_readably(module: str) -> None:
    folder = COURSE_DIR / module
    for path in _notebooks(folder):
        start = time.perf_counter()
        nb = execute_notebook(path, timeout=CELL_TIMEOUT_S, cwd=folder)
        seconds = time.perf_counter() - start
        name = f"course/{module}/{path.name}"
        stuck = [f"{_label(cell, i)}: {err[0]}" for i, cell in enumerate(nb.cells)
                 if cell.cell_type == "code" and (err := cell_error(cell))
                 and err[0] in {"CellTimeoutError", "DeadKernelError"}]
        assert not stuck, f"{name}, unanswered, did not run to the end: {stuck}"
        assert seconds <= UNANSWERED_BOUND_S, (
            f"{name}, unanswered, took {seconds:.0f} s (bound {UNANSWERED_BOUND_S} s)")
        errors = graded_cell_errors(nb)
        assert errors, f"{name} has no graded cell"
        passing = sorted(gid for gid, err in errors.items() if err is None)
        assert not passing, (f"{name}: graded cells pass with no answer written (free points, "
                             f"or hidden tests only): {passing}")
        unreadable = {gid: err for gid, err in errors.items() if err and err[0] in NOT_READABLE}
        assert not unreadable, (f"{name}: graded cells fail without a readable message when "
                                f"unanswered: {unreadable}")
