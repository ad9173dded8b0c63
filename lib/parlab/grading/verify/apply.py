"""The verifier's verdicts written into a graded notebook: its score, and where it disagreed.

nbgrader scores a test cell from its outputs (an error: 0). A test scores only when it passed
in the notebook and in the verifier: the verifier can take a point away, never give one (a
notebook that failed a test, by a check or by the grader's rules, such as a deleted test cell,
an output flood or an answer cell that killed its kernel, keeps its 0). `apply(nb, verdicts)`:
- the verifier failed a test the notebook passed: an error is added, with the verifier's
  message, so the cell scores 0 (and the learner reads why in the feedback): a hidden test's
  failure as the notebook would have shown it, anything else as VERIFIER_ENAME;
- a test the verifier could not run keeps the notebook's outcome, marked "not verified";
- a test the notebook failed is not run again (NOT_NEEDED): it scores 0 either way.
Every cell's pair of outcomes goes into the notebook's metadata (META "verifier"), which
parlab.grading.engines.merge reads for the run's record and `make report`.
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

import nbformat
from jupyter_client.manager import AsyncKernelManager
from nbgrader.coursedir import CourseDirectory
from traitlets import Bool, List, Unicode
from traitlets.config import LoggingConfigurable

from parlab.grading.base.cells import META, error_output, grade_id, has_error, is_graded_cell
from parlab.grading.verify.source import graded_cells, split_hidden
from parlab.grading.verify.verdict import NOT_RUN, Verdict

__all__ = ["apply", "disagreement", "NOT_NEEDED", "verify_notebook", "source_notebook",
           "VerifyOptions", "VERIFIER_ENAME"]
_TRUSTED_RUNS: dict = {}  # the verifier's runs of the solution, kept for the whole class

VERIFIER_ENAME = "VerifierFailed"
NOT_NEEDED = "not needed"  # the record of a test the notebook failed: 0 whatever it finds


def disagreement(notebook: str, verifier: str) -> str:
    """The sentence an instructor reads for a test where the two disagreed."""
    return f"the notebook's check {notebook}, the verifier's {verifier}"


def _failure(verdict: Verdict, *, hidden: bool) -> Any:
    """The error a cell the verifier failed gets: a hidden test's failure as the learner
    would have read it in the notebook; otherwise VERIFIER_ENAME, saying where it failed."""
    if hidden:
        ename, _, evalue = verdict.message.partition(": ")
        return error_output(ename if ename.isidentifier() else VERIFIER_ENAME, (
            f"{evalue}\n(a hidden test of this cell; the grader runs those outside your "
            "notebook's kernel)"))
    return error_output(VERIFIER_ENAME, (
        "the grader ran this test again, outside your notebook's kernel, and it failed "
        f"there:\n{verdict.message}"))


def apply(nb: Any, verdicts: dict[str, Verdict],
          withheld: bool = False) -> dict[str, dict[str, str]]:
    """Write `verdicts` into nb's graded cells (see the module doc); the record per test.
    withheld: the notebook ran only the visible tests (compared with the verifier's verdict
    on those; a failed hidden test still takes the points)."""
    record: dict[str, dict[str, str]] = {}
    for cell in nb.cells:
        if cell.cell_type != "code" or not is_graded_cell(cell):
            continue
        gid = str(grade_id(cell))
        mine = "failed" if has_error(cell) else "passed"
        verdict = verdicts.get(gid)
        if verdict is None or verdict.passed is None:
            why = verdict.message if verdict else "the verifier did not reach it"
            record[gid] = {"notebook": mine, "verifier": "not verified", "message": why}
            continue
        seen = verdict.visible if withheld and verdict.visible is not None else verdict.passed
        theirs = "passed" if seen else "failed"  # what the notebook ran, as the verifier saw it
        if verdict.message == NOT_RUN:
            record[gid] = {"notebook": mine, "verifier": NOT_NEEDED, "message": NOT_RUN}
            continue
        record[gid] = {"notebook": mine, "verifier": theirs, "message": verdict.message}
        if mine == "passed" and not verdict.passed:
            cell.outputs.append(_failure(verdict, hidden=withheld and bool(verdict.visible)))
    nb.metadata.setdefault(META, {})["verifier"] = record
    return record


def source_notebook(config: Any, resources: dict) -> Path | None:
    """The instructor's notebook that `resources` (nbgrader's, for one notebook) was made
    from, or None when it is not there."""
    info = resources.get("nbgrader", {})
    if not info.get("assignment") or not info.get("notebook"):
        return None
    course = CourseDirectory(config=config)
    path = Path(course.format_path(course.source_directory, ".", info["assignment"])) / (
        info["notebook"] + ".ipynb")
    return path if path.exists() else None


def _verifies(resources: dict, config: Any, only: list[str]) -> Path | None:
    """The source notebook when the verifier grades this one (None when it does not)."""
    assignment = resources.get("nbgrader", {}).get("assignment", "")
    return None if only and assignment not in only else source_notebook(config, resources)


def verify_notebook(nb: Any, resources: dict, *, config: Any, manager_class: type,
                    only: list[str], withheld: dict[int, str] | None = None
                    ) -> dict[str, dict[str, str]]:
    """Verify the graded notebook `nb` (nbgrader's `resources` for it) and `apply` the
    verdicts; an assignment not in `only` (when given) is marked not verified. withheld:
    cell index -> the test cell's whole code, for cells the notebook ran without their
    hidden tests (put back first)."""
    for index, code in (withheld or {}).items():
        nb.cells[index].source = code
    start = time.monotonic()
    assignment = resources.get("nbgrader", {}).get("assignment", "")
    source = _verifies(resources, config, only)
    if only and assignment not in only:
        why = f"the verifier does not grade {assignment} yet (ResilientExecute.verify_only)"
        verdicts = {gid: Verdict(gid, None, why) for gid, _, _ in graded_cells(nb)}
    elif source is None:
        verdicts = {}
    else:
        cwd = resources.get("metadata", {}).get("path") or os.getcwd()
        failed = {str(grade_id(c)) for c in nb.cells if c.cell_type == "code"
                  and is_graded_cell(c) and has_error(c)}
        from parlab.grading.verify.verifier import verify  # torch and the checks: only here

        verdicts = verify(nb, nbformat.read(str(source), as_version=4), cwd=cwd,
                          manager_class=manager_class, cache=_TRUSTED_RUNS, settled=failed)
    record = apply(nb, verdicts, withheld=bool(withheld))
    nb.metadata[META]["verifier_seconds"] = round(time.monotonic() - start, 1)
    return record


class VerifyOptions(LoggingConfigurable):
    """ResilientExecute's verifier switches (a mixin, like parlab.grading.autograde.limits')."""

    verify = Bool(
        False, help="Run every graded test again in the verifier, a process that never runs "
        "learner code (parlab.grading.verify): a test scores when it passes there too. Needs "
        "the instructor's source notebook.").tag(config=True)
    verify_only = List(
        Unicode(), default_value=[], help="The assignments the verifier grades (all when "
        "empty); the others keep their notebook's verdicts, marked 'not verified'."
    ).tag(config=True)

    def withhold_hidden(self, resources: Any) -> dict[int, str]:
        """Before the notebook runs: when the verifier will grade it, take the hidden tests
        out of its test cells (the verifier runs them, the learner's kernel never sees them);
        cell index -> the whole code, for `verify_graded` to put back."""
        this: Any = self
        if not self.verify or _verifies(resources or {}, self.config,
                                        list(self.verify_only)) is None:
            return {}
        withheld = {}
        for index, cell in enumerate(this.nb.cells):
            if cell.cell_type == "code" and is_graded_cell(cell):
                visible, hidden = split_hidden(cell.source)
                if hidden:
                    withheld[index], cell.source = cell.source, visible
        return withheld

    def verify_graded(self, resources: Any, withheld: dict[int, str]) -> None:
        """`verify_notebook` on the notebook this executor just ran."""
        this: Any = self
        manager = this.manager_class(this.warm_kernels) if (
            this.warm_kernels or this.sandbox) else AsyncKernelManager
        verify_notebook(this.nb, resources or {}, config=self.config, manager_class=manager,
                        only=list(self.verify_only), withheld=withheld)
