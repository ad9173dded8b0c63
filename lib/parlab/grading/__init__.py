"""parlab.grading: releasing, collecting, autograding and reporting on the course; the self-check.

Instructor-side code (and the learner's self-check); reference code never imports it. Run it as
`python -m parlab.grading <command>` (collect, autograde, export, feedback, check, fake; see
parlab.grading.cli), which is what the Makefile's targets call.

Public API (what tests, scripts, benchmarks and autograder/nbgrader_config.py import):

- paths: `REPO_ROOT`, `AUTOGRADER_DIR`, `SOLUTIONS_DIR`, `COURSE_DIR`, `WORKSPACE_DIR`,
  `list_modules(folder)`.
- cells: `grade_id`, `is_answer_cell`, `is_graded_cell`, `has_error`, `cell_error`,
  `graded_cell_errors`.
- nbgrader: `run_nbgrader(*args, root=...)`, `generate_release`, `autograde` (one nbgrader
  call), `submitted`, `read_scores`, `max_score`; `NbgraderRun`, `NbgraderError`,
  `AutogradeResult`.
- notebooks: `unreadable_reason(path)`, `execute_notebook(path)`, `fake_submission`,
  `fake_class`.
- the grading pipeline: `autograde_parallel` (workers, one gradebook writer) returning a
  `GradeRun` of `Graded`; `leftover_processes`, `kill_kernel_tree`; `collect`.
- the sandbox every graded kernel runs in: parlab.grading.sandbox (`Sandbox`, `Limits`,
  `problem`), its limits as nbgrader options (parlab.grading.autograde.limits), the kernel manager
  that starts kernels in it (parlab.grading.autograde.kernels).
- the verifier: parlab.grading.verify (`verify`, `Verdict`), which runs every graded test
  again in the grading process, the learner's code only in sandboxed processes
  (parlab.sandboxed) that send back plain data; ResilientExecute's `verify` option.
- nbgrader preprocessors named in autograder/nbgrader_config.py: `ResilientExecute` (every
  submission graded, whatever its kernel does), `ParlabOverwriteCells` (restored test cells
  marked), `HideHiddenTests` (feedback without hidden tests).
- feedback: `write_feedback`, `leaks`, `distinctive_hidden_lines`, `hidden_lines`,
  `normalise`, `MIN_CHARS`.
- the learner's self-check: `selfcheck(path)` (rows of `Row`), `learner_notebook(module)`,
  and `standing(module=None)`, which a notebook's last cell calls to print the self-check's
  table for the saved file (skipped when a grading tool runs the notebook).
- the instructor's records: `collect` (parlab.grading.collect.inbox), `export_grades`,
  `write_report`, `class_results` (parlab.grading.engines.record).
"""

import parlab.grading.base.startup  # noqa: F401  # first: it declines a slow optional import
from parlab.grading.autograde.execute import ResilientExecute
from parlab.grading.autograde.overwrite import ParlabOverwriteCells
from parlab.grading.base.cells import (
    cell_error,
    grade_id,
    graded_cell_errors,
    has_error,
    is_answer_cell,
    is_graded_cell,
)
from parlab.grading.base.notebooks import (
    SELFCHECK_ENV,
    TIMEOUT_ENAME,
    execute_notebook,
    unreadable_reason,
)
from parlab.grading.base.paths import (
    AUTOGRADER_DIR,
    COURSE_DIR,
    REPO_ROOT,
    SOLUTIONS_DIR,
    WORKSPACE_DIR,
    list_modules,
)
from parlab.grading.base.procs import kill_kernel_tree
from parlab.grading.base.runner import (
    AutogradeResult,
    NbgraderError,
    NbgraderRun,
    autograde,
    generate_release,
    max_score,
    read_scores,
    run_nbgrader,
    submitted,
)
from parlab.grading.collect.fake import fake_class, fake_submission
from parlab.grading.collect.inbox import collect
from parlab.grading.engines.grade import autograde_parallel
from parlab.grading.engines.record import class_results
from parlab.grading.engines.results import Graded, GradeRun, leftover_processes
from parlab.grading.feedback.hidden import (
    MIN_CHARS,
    HideHiddenTests,
    distinctive_hidden_lines,
    hidden_lines,
    leaks,
    normalise,
)
from parlab.grading.feedback.withhold import write_feedback
from parlab.grading.learner.in_notebook import standing
from parlab.grading.learner.selfcheck import Row, learner_notebook, selfcheck
from parlab.grading.report.export import export_grades
from parlab.grading.report.html import write_report

__all__ = [
    "AUTOGRADER_DIR", "COURSE_DIR", "MIN_CHARS", "REPO_ROOT", "SOLUTIONS_DIR", "TIMEOUT_ENAME",
    "WORKSPACE_DIR", "AutogradeResult", "GradeRun", "Graded", "HideHiddenTests", "NbgraderError",
    "NbgraderRun", "ParlabOverwriteCells", "ResilientExecute", "Row", "autograde",
    "autograde_parallel", "cell_error", "collect", "distinctive_hidden_lines",
    "execute_notebook", "fake_class", "fake_submission", "generate_release", "grade_id",
    "graded_cell_errors", "has_error", "hidden_lines", "is_answer_cell", "is_graded_cell",
    "kill_kernel_tree", "learner_notebook", "leaks", "leftover_processes", "list_modules",
    "max_score", "normalise", "read_scores", "run_nbgrader", "selfcheck", "submitted",
    "unreadable_reason", "write_feedback", "standing", "export_grades", "write_report",
    "class_results", "SELFCHECK_ENV",
]
