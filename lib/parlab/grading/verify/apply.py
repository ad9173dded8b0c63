"""The verifier's verdicts written into a graded notebook: its score, and where it disagreed.

nbgrader scores a test cell from its outputs (an error: 0). A test scores only when it passed
in the notebook and in the verifier: the verifier can take a point away, never give one (a
notebook that failed a test, by a check or by the grader's rules, such as a deleted test cell,
an output flood or an answer cell that killed its kernel, keeps its 0). `apply(nb, verdicts)`:
- the verifier failed a test the notebook passed: an error is added, with the verifier's
  message, so the cell scores 0 (and the learner reads why in the feedback);
- a test the verifier could not run keeps the notebook's outcome, marked "not verified".
Every cell's pair of outcomes goes into the notebook's metadata (META "verifier"), which
parlab.grading.merge reads for the run's record and `make report`.
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

from parlab.grading.cells import META, error_output, grade_id, has_error, is_graded_cell
from parlab.grading.verify.source import graded_cells
from parlab.grading.verify.verifier import Verdict, verify

__all__ = ["apply", "disagreement", "verify_notebook", "source_notebook", "VerifyOptions",
           "VERIFIER_ENAME"]
_TRUSTED_RUNS: dict = {}  # the verifier's runs of the solution, kept for the whole class

VERIFIER_ENAME = "VerifierFailed"


def disagreement(notebook: str, verifier: str) -> str:
    """The sentence an instructor reads for a test where the two disagreed."""
    return f"the notebook's check {notebook}, the verifier's {verifier}"


def apply(nb: Any, verdicts: dict[str, Verdict]) -> dict[str, dict[str, str]]:
    """Write `verdicts` into nb's graded cells (see the module doc); the record per test."""
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
        theirs = "passed" if verdict.passed else "failed"
        record[gid] = {"notebook": mine, "verifier": theirs, "message": verdict.message}
        if mine == "passed" and theirs == "failed":
            cell.outputs.append(error_output(VERIFIER_ENAME, (
                "the grader ran this test again, outside your notebook's kernel, and it "
                f"failed there:\n{verdict.message}")))
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


def verify_notebook(nb: Any, resources: dict, *, config: Any, manager_class: type,
                    only: list[str]) -> dict[str, dict[str, str]]:
    """Verify the graded notebook `nb` (nbgrader's `resources` for it) and `apply` the
    verdicts; an assignment not in `only` (when given) is marked not verified."""
    start = time.monotonic()
    assignment = resources.get("nbgrader", {}).get("assignment", "")
    source = source_notebook(config, resources)
    if only and assignment not in only:
        why = f"the verifier does not grade {assignment} yet (ResilientExecute.verify_only)"
        verdicts = {gid: Verdict(gid, None, why) for gid, _, _ in graded_cells(nb)}
    elif source is None:
        verdicts = {}
    else:
        cwd = resources.get("metadata", {}).get("path") or os.getcwd()
        verdicts = verify(nb, nbformat.read(str(source), as_version=4), cwd=cwd,
                          manager_class=manager_class, cache=_TRUSTED_RUNS)
    record = apply(nb, verdicts)
    nb.metadata[META]["verifier_seconds"] = round(time.monotonic() - start, 1)
    return record


class VerifyOptions(LoggingConfigurable):
    """ResilientExecute's verifier switches (a mixin, like parlab.grading.limits')."""

    verify = Bool(
        False, help="Run every graded test again in the verifier, a process that never runs "
        "learner code (parlab.grading.verify): a test scores when it passes there too. Needs "
        "the instructor's source notebook.").tag(config=True)
    verify_only = List(
        Unicode(), default_value=[], help="The assignments the verifier grades (all when "
        "empty); the others keep their notebook's verdicts, marked 'not verified'."
    ).tag(config=True)

    def verify_graded(self, resources: Any) -> None:
        """`verify_notebook` on the notebook this executor just ran."""
        this: Any = self
        manager = this.manager_class(this.warm_kernels) if (
            this.warm_kernels or this.sandbox) else AsyncKernelManager
        verify_notebook(this.nb, resources or {}, config=self.config, manager_class=manager,
                        only=list(self.verify_only))
