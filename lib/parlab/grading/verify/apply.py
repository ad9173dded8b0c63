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

from typing import Any

from parlab.grading.cells import META, error_output, grade_id, has_error, is_graded_cell
from parlab.grading.verify.verifier import Verdict

__all__ = ["apply", "disagreement", "VERIFIER_ENAME"]

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
