"""A learner's self-check: the visible tests of your own notebook, judged as the grader will.

    make check MODULE=02_tensor_parallel   # or: python -m parlab.grading check 02_tensor_parallel

Runs workspace/<module>/<module>.ipynb (your working copy, made by `make lab`), or
course/<module>/<module>.ipynb (the blank release) when you have no copy yet, in a fresh kernel
with the grader's executor and limits (autograder/nbgrader_config.py), and prints one row per
test cell: passed, failed with its message, timed out, or why it did not run. As at grading
time, a locked test cell you edited runs as released, and one you deleted scores 0. Hidden
tests exist only at grading time, so passing here is necessary, not sufficient. Your notebook
file is never written to. The kernel runs with NBGRADER_EXECUTION=autograde, as at grading,
and PARLAB_SELFCHECK=1, so that a `standing()` cell in the notebook does not start a
self-check of its own (parlab.grading.learner.in_notebook).
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import os
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import nbformat

from parlab.grading.autograde.execute import ResilientExecute
from parlab.grading.base.cells import META, grade_id, is_graded_cell
from parlab.grading.base.config import config_value
from parlab.grading.base.notebooks import SELFCHECK_ENV, unreadable_reason
from parlab.grading.base.paths import COURSE_DIR, REPO_ROOT, WORKSPACE_DIR, list_modules

VERDICTS = {"CellTimeoutError": "TIMED OUT", "SubmissionTimeLimit": "TIMED OUT",
            "KernelDied": "KERNEL DIED", "KernelUnresponsive": "HUNG",
            "TestCellDeleted": "DELETED", "NotRun": "NOT RUN", "InvalidNotebook": "UNREADABLE"}


@dataclass(frozen=True)
class Row:
    test: str  # the test cell's grade_id
    points: float
    verdict: str  # "passed", "FAILED", "TIMED OUT", ...
    message: str  # what to act on, "" when passed


def learner_notebook(module: str, workspace: Path = WORKSPACE_DIR,
                     course: Path = COURSE_DIR) -> tuple[Path, str]:
    """(the notebook to check, a phrase saying which one it is)."""
    mine = workspace / module / f"{module}.ipynb"
    if mine.exists():
        return mine, "your working copy"
    return (course / module / f"{module}.ipynb",
            f"the blank release; you have no {workspace.name}/{module}/ yet, `make lab` makes it")


def restore_tests(nb: nbformat.NotebookNode, release: nbformat.NotebookNode) -> None:
    """Put released test cells back as the grader does: edited ones as released (marked
    'edited'), deleted ones after the cell that preceded them (marked 'deleted')."""
    mine = {grade_id(c): c for c in nb.cells if grade_id(c)}
    previous = None
    for cell in release.cells:
        gid = grade_id(cell)
        if gid and is_graded_cell(cell) and cell.metadata["nbgrader"].get("locked"):
            if gid not in mine:
                back = copy.deepcopy(cell)
                back.metadata[META] = {"restored": "deleted"}
                at = nb.cells.index(mine[previous]) + 1 if previous in mine else len(nb.cells)
                nb.cells.insert(at, back)
                mine[gid] = back
            elif mine[gid].source != cell.source:
                mine[gid].source = cell.source
                mine[gid].metadata.setdefault(META, {})["restored"] = "edited"
        previous = gid or previous


def _verdict(cell: nbformat.NotebookNode) -> tuple[str, str]:
    errors = [o for o in cell.get("outputs", []) if o.get("output_type") == "error"]
    if not errors:
        return "passed", ""
    err = errors[-1]
    lines = []
    for line in (err.get("evalue") or "").strip().splitlines():
        if not line.strip() or line.startswith(("---", "state of every rank")):
            break  # the rest is a rank's traceback and state: in the notebook, not the table
        lines.append(line.strip())
    message = f"{err.get('ename')}: " + " / ".join(lines[:2])
    return VERDICTS.get(err.get("ename"), "FAILED"), message


@contextlib.contextmanager
def _environment(**values: str) -> Iterator[None]:
    """Set environment variables (inherited by the kernels started meanwhile), then restore."""
    previous = {k: os.environ.get(k) for k in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for key, value in previous.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


def selfcheck(path: Path, release: Path | None = None, *, timeout: int | None = None) -> list[Row]:
    """Run the notebook at `path` as the grader does; one Row per test cell."""
    path = Path(path)
    why = unreadable_reason(path)
    if why:
        return [Row("(whole notebook)", 0.0, "UNREADABLE", why)]
    nb = nbformat.read(str(path), as_version=4)
    if release is not None and release.exists() and release.resolve() != path.resolve():
        restore_tests(nb, nbformat.read(str(release), as_version=4))
    executor = ResilientExecute(
        timeout=timeout or config_value("Execute", "timeout", 60),
        startup_timeout=config_value("Execute", "startup_timeout", 120),
        submission_timeout=config_value("ResilientExecute", "submission_timeout", 900),
        extra_arguments=["--HistoryManager.hist_file=:memory:", "--IPKernelApp.log_level=ERROR"])
    # The kernel sees what it sees when graded, and knows it is the self-check's: a
    # `standing()` cell in the notebook then skips instead of starting another self-check.
    with _environment(NBGRADER_EXECUTION="autograde", **{SELFCHECK_ENV: "1"}):
        executor.preprocess(nb, {"metadata": {"path": str(path.parent)}})
    return [Row(str(grade_id(c)), float(c.metadata["nbgrader"].get("points", 0)), *_verdict(c))
            for c in nb.cells if c.cell_type == "code" and is_graded_cell(c)]


def report(rows: list[Row], where: str, seconds: float) -> str:
    width = max([len(r.test) for r in rows] + [24])
    out = [f"Self-check of {where}",
           "Visible tests only, run as the grader runs them; hidden tests run at grading.", "",
           f"  {'test':<{width}}  {'points':>6}  result"]
    for r in rows:
        out.append(f"  {r.test:<{width}}  {r.points:>6g}  {r.verdict:<11} {r.message[:300]}")
    passed = [r for r in rows if r.verdict == "passed"]
    out += ["", f"{len(passed)} of {len(rows)} tests passed "
            f"({sum(r.points for r in passed):g} of {sum(r.points for r in rows):g} points); "
            f"{seconds:.0f} s."]
    return "\n".join(out)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The options of `python -m parlab.grading check` (make check)."""
    parser.add_argument("module", nargs="?", help="e.g. 02_tensor_parallel (default: all)")
    parser.add_argument("--notebook", type=Path, help="check this file instead")
    parser.add_argument("--release", type=Path, help="the released notebook to restore test "
                        "cells from (default: course/<module>/<module>.ipynb)")
    parser.add_argument("--timeout", type=int, help="seconds per cell (default: the grader's)")
    parser.add_argument("--strict", action="store_true", help="exit 1 unless all pass")
    parser.add_argument("--which", help="how the table names the --notebook file (default: "
                        "'the notebook you named'; standing(): 'this notebook, as last saved')")


def check_command(args: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    """Self-check the modules `args` names and print a table for each; the exit status."""
    modules = [args.module] if args.module else list_modules(COURSE_DIR)
    if args.notebook:
        modules = [args.module or args.notebook.stem]
    elif args.module and args.module not in list_modules(COURSE_DIR):
        parser.error(f"no module {args.module!r} in course/; one of {list_modules(COURSE_DIR)}")
    ok = True
    for module in modules:
        path, which = learner_notebook(module)
        if args.notebook:
            path, which = args.notebook, args.which or "the notebook you named"
        start = time.perf_counter()
        release = args.release or COURSE_DIR / module / f"{module}.ipynb"
        rows = selfcheck(path, release, timeout=args.timeout)
        shown = path.resolve().relative_to(REPO_ROOT) if path.resolve().is_relative_to(
            REPO_ROOT) else path
        print(report(rows, f"{shown} ({which})", time.perf_counter() - start), flush=True)
        ok = ok and all(r.verdict == "passed" for r in rows)
    return 1 if args.strict and not ok else 0
