"""`make feedback`: nbgrader's feedback for each student, with nothing the release hides.

nbgrader writes the pages, through the course's HideHiddenTests (parlab.grading.feedback.hidden) and
its exporter FeedbackGuard (parlab.grading.feedback.leakcheck), which refuses a page that shows a
secret line; then every file of feedback/ is scanned again, and any that shows one is
deleted. Each file withheld either way gets one line for the instructor.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import TextIO

from parlab.grading.feedback import leakcheck
from parlab.grading.base.paths import REPO_ROOT
from parlab.grading.base.runner import NbgraderError, run_nbgrader


def write_feedback(root: Path = REPO_ROOT, module: str = "*",
                   out: TextIO | None = None) -> list[tuple[Path, list[str]]]:
    """nbgrader generate_feedback, then withhold every file that shows a secret line.

    The secret lines and the rule (hidden-test lines always; a solution-only line unless the
    student handed it in themselves) are parlab.grading.feedback.leakcheck's. Files that
    nbgrader's exporter (leakcheck.FeedbackGuard) refused to write, and files the scan after
    it finds and deletes, are each reported on `out` (default stderr) with one WITHHELD line
    naming the student, the module and the offending line (shortened).
    Returns (file, ["<kind> line '<line>'"]) for every file withheld; [] when none leaks.
    Raises NbgraderError when nbgrader failed for another reason than a withheld file.
    """
    root = Path(root).resolve()
    run = run_nbgrader("generate_feedback", module, "--force", root=root, check=False)
    refused = leakcheck.withheld_in_log(run.output)
    unexplained = leakcheck.failed_in_log(run.output) - {(w.student, w.module) for w in refused}
    if run.returncode != 0 and (unexplained or not refused):
        raise NbgraderError(f"nbgrader generate_feedback {module} exited {run.returncode}"
                            f"{f' for {sorted(unexplained)}' if unexplained else ''}:\n"
                            f"{run.output[-4000:]}")
    withheld = refused + leakcheck.scan_feedback(root, module)
    for w in withheld:
        print(w.message(), file=out or sys.stderr)
    return [(Path(w.path), [f"{w.kind} line {w.line!r}"]) for w in withheld]
