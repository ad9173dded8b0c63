"""nbgrader configuration for Parallelism Lab (nbgrader 0.9).

nbgrader reads nbgrader_config.py from its working directory. The grading commands run it from
autograder/ (`parlab.grading.run_nbgrader` passes `cwd=autograder/`); from the repository root
(`make formgrader`, `make lab`'s Validate button, a plain `nbgrader ...` typed there) the
root's nbgrader_config.py loads this file, so every launch mode uses this configuration and
its feedback filter. Tests point it at a temporary course root with
`--CourseDirectory.root=...`, which the command line lets override what is set here, or with
PARLAB_COURSE_ROOT (`make formgrader COURSE_ROOT=...`), for a server.
"""

import os
from pathlib import Path

c = get_config()  # noqa: F821 -- injected by traitlets when it executes this file

# The repository root, found from this file rather than the working directory, so that the
# configuration works from any clone path and from any directory nbgrader is started in.
REPO_ROOT = Path(__file__).resolve().parent.parent

# --- Course layout (see DESIGN.md, "Layout") ------------------------------------------------
# All nbgrader steps live under the repository root: solutions/, course/, and the git-ignored
# instructor workspace (submitted/, autograded/, feedback/, gradebook.db).
c.CourseDirectory.root = os.environ.get("PARLAB_COURSE_ROOT") or str(REPO_ROOT)
# The nbgrader *source* (full answers and hidden tests) is solutions/<module>/<module>.ipynb.
c.CourseDirectory.source_directory = "solutions"
# The *release* that learners open is course/<module>/<module>.ipynb, committed to git.
c.CourseDirectory.release_directory = "course"
# The gradebook is sqlite at <root>/gradebook.db (git-ignored). This is nbgrader's own
# default, derived from CourseDirectory.root when first read; we leave db_url unset on
# purpose so that `--CourseDirectory.root=<tmp>` (tests) also moves the gradebook to
# <tmp>/gradebook.db instead of writing test runs into the instructor's real gradebook.
# Setting c.CourseDirectory.db_url here would pin it to the repository for every root.

# Files in a module folder that are never copied into the release or into autograded
# submissions: editor, test-runner and interpreter caches, on top of nbgrader's defaults.
c.CourseDirectory.ignore = [
    ".ipynb_checkpoints",  # JupyterLab autosave copies (may hold answers)
    ".virtual_documents",  # jupyterlab-lsp shadow copies (may hold answers)
    "__pycache__",
    "*.pyc",
    ".pytest_cache",
    ".ruff_cache",
    ".DS_Store",
    "feedback",  # nbgrader default: a learner's fetched feedback folder
]

# --- generate_assignment ----------------------------------------------------------------------
# What replaces each `### BEGIN SOLUTION ... ### END SOLUTION` region in the release. It raises
# so that an unanswered exercise fails its own test cell at once, with a message that tells a
# learner what to do (tests/test_notebooks.py checks every graded cell fails this way).
c.ClearSolutions.code_stub = {
    "python": (
        "# YOUR CODE HERE\n"
        'raise NotImplementedError("Write your answer here, then run the test cell below.")'
    )
}
# The same for written (markdown) answers.
c.ClearSolutions.text_stub = "YOUR ANSWER HERE"

# --- autograde --------------------------------------------------------------------------------
# Per-cell limit when nbgrader executes a submission; on expiry it interrupts the kernel, marks
# the cell CellTimeoutError and grades the remaining cells. Our distributed checks use a shorter
# launcher timeout (parlab.launch.run), so a deadlocked answer fails its own test with a readable
# CollectiveTimeout before nbgrader steps in. nbgrader's default (30 s) is too tight for a
# module's slowest graded cell on a 2-core machine.
c.Execute.timeout = 60
# Start-up of a kernel that imports torch can exceed nbclient's 60 s default on a loaded
# 2-core grader; a kernel that fails to start loses the whole submission.
c.Execute.startup_timeout = 120

# --- grading every submission, whatever it does (parlab.grading.autograde.execute) ---------
# nbgrader drops a whole submission whose kernel dies (os._exit, killed for memory) or ignores
# the interrupt sent on a cell timeout. ResilientExecute records a readable error on that cell,
# kills the kernel's process tree (ranks included), starts a new kernel, re-runs the cells that
# had succeeded, and goes on; ParlabOverwriteCells marks locked test cells it had to restore
# (edited: run as released, with a note) or put back (deleted: scored 0 with a message).
from nbconvert.preprocessors import ClearMetadataPreprocessor, CSSHTMLHeaderPreprocessor  # noqa: E402
from nbgrader.preprocessors import (  # noqa: E402
    AssignLatePenalties,
    CheckCellMetadata,
    ClearOutput,
    DeduplicateIds,
    GetGrades,
    IgnorePattern,
    LimitOutput,
    OverwriteKernelspec,
    SaveAutoGrades,
)

from parlab.grading import (  # noqa: E402
    HideHiddenTests,
    ParlabOverwriteCells,
    ResilientExecute,
)

c.Autograde.sanitize_preprocessors = [
    ClearOutput, DeduplicateIds, OverwriteKernelspec, ParlabOverwriteCells, CheckCellMetadata]
c.Autograde.autograde_preprocessors = [
    ResilientExecute, IgnorePattern, ClearMetadataPreprocessor, LimitOutput, SaveAutoGrades,
    AssignLatePenalties, CheckCellMetadata]
# The most seconds one submitted notebook may run, kernel restarts included (each cell is also
# bounded by Execute.timeout); what it has not reached by then scores 0, with a message.
c.ResilientExecute.submission_timeout = 900
# A test cell the learner deleted is put back and scored 0 with a message (True: run it).
c.ResilientExecute.run_restored_tests = False
# Throughput (autograder/README.md, "Grading a large class"): each nbgrader process forks its
# kernels from one template that has imported torch and the checks
# (parlab.grading.autograde.warm), and
# no cell after the last graded one runs (cells run in order: nothing there can change a
# score). Tested: tests/test_warm.py, test_faults.py (the fault corpus, warm), the course run
# (every module's solutions, warm) and tests/test_class_bench.py (scores equal the plain
# executor's); `--ResilientExecute.warm_kernels=False
# --ResilientExecute.skip_after_last_test=False` grades the plain way.
c.ResilientExecute.warm_kernels = True
c.ResilientExecute.skip_after_last_test = True

# --- a class that may be hostile (autograder/README.md, "The threat model") -------------------
# Every kernel, and everything it starts, runs in a sandbox of its own (bubblewrap; see
# parlab.grading.sandbox for its list of binds): none of the course's files but Python and lib/,
# its own copy of the submission's folder, its own processes and loopback network, as nobody.
# `make autograde` refuses to grade when no sandbox can be made here (`make sandbox` installs
# bubblewrap), unless told UNSAFE=1, which is recorded and shown by `make export`.
c.ResilientExecute.sandbox = True
# Every graded test is run again by the verifier (parlab.grading.verify): the test's code in
# the grading process, which never runs learner code; the learner's code only in processes
# of the submission's sandbox, which send back plain data. A test scores when it passes in the
# notebook and in the verifier; where the two disagree, `make report` says so.
c.ResilientExecute.verify = True
# Which modules it grades: all of them (an empty list). Every module's corpus (solutions,
# blank, half done, autograder/mistakes/) gets the same verdicts from the verifier as from the
# notebook (tests/test_verifier.py). To keep a module's notebook verdicts while you look into
# a difference, list the others here: the one left out is reported "not verified".
c.ResilientExecute.verify_only = []
# What one submission may use, all its processes together (parlab.grading.autograde.limits);
# a cell that hits a limit scores 0 with a message naming it.
c.ResilientExecute.memory_limit = 6 * 2**30  # bytes of memory (module 08 peaks near 4 GiB)
c.ResilientExecute.process_limit = 1024  # processes and threads at once (08: about 650)
c.ResilientExecute.file_limit = 256 * 2**20  # bytes of any one file
c.ResilientExecute.disk_limit = 512 * 2**20  # bytes of each of /tmp, /dev/shm, its folder
# Output per cell and per notebook (parlab.grading.autograde.outputs): past either, the rest
# is cut off and the cell scores 0 with an OutputLimit error naming the limit.
c.ResilientExecute.cell_output_limit = 1_000_000
c.ResilientExecute.notebook_output_limit = 10_000_000

# --- generate_feedback ------------------------------------------------------------------------
# nbgrader's feedback shows hidden tests, in the cells and in the tracebacks that quote them.
# HideHiddenTests removes them from both. FeedbackGuard, the exporter, then refuses any page
# (and any file copied beside it) that still shows a hidden-test line or a solution-only line
# the student did not write (parlab.grading.feedback.leakcheck): nothing of that student's module
# feedback is written, and the log names the student, module and line; this holds for the
# formgrader's button too. `python -m parlab.grading feedback` checks every file again.
c.GenerateFeedback.preprocessors = [GetGrades, CSSHTMLHeaderPreprocessor, HideHiddenTests]
from parlab.grading.feedback.leakcheck import FeedbackGuard  # noqa: E402

c.GenerateFeedback.exporter_class = FeedbackGuard
