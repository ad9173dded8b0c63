"""A verdict of the verifier (parlab.grading.verify.verifier), as plain data: what the
autograder's executor reads without importing the verifier (and torch with it)."""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["NOT_RUN", "Verdict"]
NOT_RUN = "not run again: it failed in the notebook, so it scores 0 either way"


@dataclass(frozen=True)
class Verdict:
    """The verifier's word on one graded test."""

    grade_id: str
    passed: bool | None  # None: not verified (the verifier could not run)
    message: str = ""  # why it failed (what the learner reads), or why it was not verified
    visible: bool | None = None  # its visible part alone passed (what a notebook that runs
    # only the visible tests can be compared with)
