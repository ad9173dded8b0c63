"""Instructor-side grading helpers: release, fake submissions, autograde, notebook execution.

Used by tests/ (release staleness, notebook execution, the nbgrader round trip) and by make
targets; never imported by a learner's notebook.

Every nbgrader step runs as the command line does (`python -m nbgrader ...` from autograder/,
so autograder/nbgrader_config.py applies); another course root, such as a temporary copy in a
test, is passed with `--CourseDirectory.root`. Scores are read from the sqlite gradebook with
`nbgrader.api.Gradebook`, never inferred from exit codes (DESIGN.md, "Grading").

nbgrader quirks handled here:
- A new gradebook runs the `alembic` executable found on PATH, which is missing when the venv is
  not activated; `run_nbgrader` puts this interpreter's bin/ first on PATH.
- A submission whose kernel dies or cannot be interrupted is dropped ("Removing failed
  assignment") but keeps its gradebook row, with a score of 0; `autograde` reports it as None
  (no autograded notebook on disk) so it is never mistaken for a real 0.
"""

from __future__ import annotations

import copy
import fnmatch
import logging
import os
import re
import subprocess
import sys
import time
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

import nbformat
from nbclient import NotebookClient
from nbclient.exceptions import CellTimeoutError, DeadKernelError
from nbformat import NotebookNode

log = logging.getLogger(__name__)

REPO_ROOT = Path(__file__).resolve().parents[2]
AUTOGRADER_DIR = REPO_ROOT / "autograder"  # holds nbgrader_config.py; nbgrader runs from here
SOLUTIONS_DIR = REPO_ROOT / "solutions"  # nbgrader source
COURSE_DIR = REPO_ROOT / "course"  # nbgrader release

# The ename a cell gets when execute_notebook (like nbgrader) gives up waiting for it.
TIMEOUT_ENAME = "CellTimeoutError"
# Lines that mark a solution region in the source (nbgrader's ClearSolutions delimiters).
_SOLUTION_DELIMITER = re.compile(r"^\s*#+\s*(BEGIN|END) SOLUTION\s*$")


class NbgraderError(RuntimeError):
    """An nbgrader command failed; the message holds the end of its log."""


@dataclass(frozen=True)
class NbgraderRun:
    """One nbgrader command line: what ran, how it ended, how long it took, what it logged."""

    args: tuple[str, ...]
    returncode: int
    seconds: float
    output: str


@dataclass(frozen=True)
class AutogradeResult:
    """Scores read from the gradebook after one `nbgrader autograde` call.

    scores[module][student] is None when nbgrader dropped that submission (no autograded
    notebook on disk, whatever the gradebook row says); max_scores[module] is the module's total.
    """

    scores: dict[str, dict[str, float | None]]
    max_scores: dict[str, float]
    run: NbgraderRun


def list_modules(directory: Path) -> list[str]:
    """Module folders in `directory` (solutions/, course/), sorted; hidden and _private skipped."""
    if not directory.is_dir():
        return []
    return sorted(
        p.name for p in directory.iterdir() if p.is_dir() and not p.name.startswith((".", "_"))
    )


def run_nbgrader(*args: str, root: Path = REPO_ROOT, check: bool = True,
                 timeout: float | None = None) -> NbgraderRun:
    """Run `nbgrader <args> --CourseDirectory.root=<root>` from autograder/ and time it."""
    root_arg = f"--CourseDirectory.root={Path(root).resolve()}"
    cmd = [sys.executable, "-m", "nbgrader", *args, root_arg]
    env = dict(os.environ)
    # nbgrader runs `alembic` by name when it creates a gradebook: make it this venv's.
    env["PATH"] = os.pathsep.join([str(Path(sys.executable).parent), env.get("PATH", "")])
    start = time.perf_counter()
    proc = subprocess.run(cmd, cwd=AUTOGRADER_DIR, env=env, stdout=subprocess.PIPE,
                          stderr=subprocess.STDOUT, text=True, timeout=timeout, check=False)
    run = NbgraderRun(tuple(args), proc.returncode, time.perf_counter() - start, proc.stdout)
    log.info("nbgrader %s: exit %d in %.1f s", " ".join(args), run.returncode, run.seconds)
    if check and run.returncode != 0:
        raise NbgraderError(f"nbgrader {' '.join(args)} exited {run.returncode} after "
                            f"{run.seconds:.1f} s:\n{run.output[-4000:]}")
    return run


def generate_release(module: str = "*", *, root: Path = REPO_ROOT,
                     release_dir: Path | None = None, database: bool = False) -> NbgraderRun:
    """`nbgrader generate_assignment` for one module ("*" = every module, in one call).

    release_dir: where the release goes (default: the config's course/ under `root`); give a
    temporary folder to regenerate for a staleness check. database: also record the module in
    `root`/gradebook.db, which `nbgrader autograde` needs; off for a plain release, so that
    releasing never touches the instructor's gradebook.
    """
    args = ["generate_assignment", module, "--force"]
    if release_dir is not None:
        args.append(f"--CourseDirectory.release_directory={Path(release_dir).resolve()}")
    if not database:
        args.append("--no-db")
    return run_nbgrader(*args, root=root)


def _as_notebook(nb: NotebookNode | Path | str) -> NotebookNode:
    if isinstance(nb, (str, Path)):
        return nbformat.read(str(nb), as_version=4)
    return nb


def _nbgrader_meta(cell: NotebookNode) -> dict:
    return cell.get("metadata", {}).get("nbgrader", {})


def is_answer_cell(cell: NotebookNode) -> bool:
    """A cell the learner writes in (nbgrader `solution: true`)."""
    return bool(_nbgrader_meta(cell).get("solution", False))


def is_graded_cell(cell: NotebookNode) -> bool:
    """A cell that carries points (nbgrader `grade: true`)."""
    return bool(_nbgrader_meta(cell).get("grade", False))


def grade_id(cell: NotebookNode) -> str | None:
    return _nbgrader_meta(cell).get("grade_id")


def fake_submission(source_nb: NotebookNode | Path | str,
                    release_nb: NotebookNode | Path | str) -> NotebookNode:
    """A full-marks submission: the release with each answer cell filled from the solutions.

    Answer cells are matched by nbgrader grade_id; their source becomes the solution cell's
    source without the BEGIN/END SOLUTION lines. Everything else, metadata and checksums of
    locked cells included, stays as released, as in a real learner's notebook.
    """
    source, submission = _as_notebook(source_nb), copy.deepcopy(_as_notebook(release_nb))
    answers = {grade_id(c): c.source for c in source.cells if is_answer_cell(c)}
    released = {grade_id(c) for c in submission.cells if is_answer_cell(c)}
    if set(answers) != released:
        raise ValueError(f"answer cells differ between source and release: source has "
                         f"{sorted(map(str, answers))}, release has {sorted(map(str, released))}")
    for cell in submission.cells:
        if is_answer_cell(cell):
            lines = answers[grade_id(cell)].splitlines()
            cell.source = "\n".join(ln for ln in lines if not _SOLUTION_DELIMITER.match(ln))
    return submission


def submitted(course_root: Path, module: str = "*") -> dict[str, list[str]]:
    """Who submitted what: {module: [student, ...]} from submitted/<student>/<module>/."""
    root = Path(course_root) / "submitted"
    found: dict[str, list[str]] = {}
    for student in list_modules(root):
        for m in list_modules(root / student):
            if fnmatch.fnmatchcase(m, module):
                found.setdefault(m, []).append(student)
    return found


def read_scores(course_root: Path, module: str, students: Iterable[str]) -> dict[str, float | None]:
    """Each student's total score for `module` from the gradebook; None if not (auto)graded."""
    from nbgrader.api import Gradebook, MissingEntry

    students = list(students)
    db = Path(course_root) / "gradebook.db"
    if not db.exists():
        return dict.fromkeys(students)
    scores: dict[str, float | None] = {}
    with Gradebook(f"sqlite:///{db}", course_id="") as gb:
        for student in students:
            try:
                submission = gb.find_submission(module, student)
            except MissingEntry:
                scores[student] = None
                continue
            # A dropped submission keeps its row (score 0); only the notebook on disk tells.
            graded_dir = Path(course_root) / "autograded" / student / module
            on_disk = all((graded_dir / f"{nb.name}.ipynb").exists() for nb in submission.notebooks)
            scores[student] = float(submission.score) if on_disk else None
    return scores


def max_score(course_root: Path, module: str) -> float:
    """The module's total points, from the gradebook (recorded by generate_release)."""
    from nbgrader.api import Gradebook

    with Gradebook(f"sqlite:///{Path(course_root) / 'gradebook.db'}", course_id="") as gb:
        return float(gb.find_assignment(module).max_score)


def autograde(course_root: Path, module: str = "*",
              students: Iterable[str] | None = None) -> AutogradeResult:
    """`nbgrader autograde` submitted/<student>/<module>/ in ONE call; read the scores back.

    module: a name or a glob ("*": every module with a submission), so a whole class costs
    one nbgrader start-up. students: whom to grade (default: everyone who submitted); the
    others are left out with CourseDirectory.student_id_exclude. Each module must be in the
    gradebook already (`generate_release(..., database=True)`). nbgrader's exit status is
    logged, not trusted: a score that is not in the gradebook comes back as None.
    """
    course_root = Path(course_root).resolve()
    by_module = submitted(course_root, module)
    everyone = sorted({s for names in by_module.values() for s in names})
    wanted = everyone if students is None else sorted(set(students))
    args = ["autograde", module, "--force"]
    excluded = sorted(set(everyone) - set(wanted))
    if excluded:
        args.append(f"--CourseDirectory.student_id_exclude={','.join(excluded)}")
    run = run_nbgrader(*args, root=course_root, check=False)
    if run.returncode != 0:
        log.warning("nbgrader autograde %s exited %d:\n%s", module, run.returncode,
                    run.output[-4000:])
    scores = {m: read_scores(course_root, m, [s for s in wanted if s in names])
              for m, names in by_module.items()}
    return AutogradeResult(scores, {m: max_score(course_root, m) for m in by_module}, run)


def _record_timeout(cell: NotebookNode, cell_index: int, execute_reply: dict) -> None:
    """on_cell_executed hook: nbclient's stand-in reply for a timed-out cell is not in its
    outputs; add it (as nbgrader's Execute does) so the cell shows the error."""
    content = execute_reply.get("content", {})
    if content.get("status") != "error":
        return
    if not any(o.get("output_type") == "error" and o.get("ename") == content.get("ename")
               for o in cell.get("outputs", [])):
        cell.outputs.append(nbformat.v4.new_output(
            "error", ename=content.get("ename", ""), evalue=content.get("evalue", ""),
            traceback=content.get("traceback", [])))


def execute_notebook(path: Path | str, *, timeout: float = 60, cwd: Path | str | None = None,
                     kernel_name: str = "") -> NotebookNode:
    """Run every cell like nbgrader's autograder: errors are recorded and execution goes on.

    A cell still running after `timeout` seconds is interrupted and gets a CellTimeoutError
    output; a dead kernel marks the running cell DeadKernelError and leaves the rest unrun.
    cwd: the kernel's working directory (default: the notebook's folder).
    """
    path = Path(path)
    nb = nbformat.read(str(path), as_version=4)
    client = NotebookClient(
        nb, timeout=timeout, allow_errors=True, interrupt_on_timeout=True,
        # After an interrupt, wait briefly for the kernel to settle; if it does not (a rank
        # ignoring SIGINT), raise instead of letting every later cell time out in turn.
        raise_on_iopub_timeout=True,
        error_on_timeout={"ename": TIMEOUT_ENAME, "evalue": f"no reply within {timeout} s",
                          "traceback": [f"{TIMEOUT_ENAME}: no reply within {timeout} s"]},
        kernel_name=kernel_name or nb.metadata.get("kernelspec", {}).get("name", "python3"),
        resources={"metadata": {"path": str(Path(cwd) if cwd else path.parent)}},
        on_cell_executed=_record_timeout,
    )
    with client.setup_kernel():
        for index, cell in enumerate(nb.cells):
            try:
                client.execute_cell(cell, index, execution_count=client.code_cells_executed + 1)
            except (DeadKernelError, CellTimeoutError) as exc:
                cell.outputs.append(nbformat.v4.new_output(
                    "error", ename=type(exc).__name__, evalue=str(exc), traceback=[str(exc)]))
                break
    return nb


def cell_error(cell: NotebookNode) -> tuple[str, str] | None:
    """(ename, evalue) of the last error a code cell raised, or None."""
    errors = [o for o in cell.get("outputs", []) if o.get("output_type") == "error"]
    return (errors[-1].ename, errors[-1].evalue) if errors else None


def graded_cell_errors(nb: NotebookNode) -> dict[str, tuple[str, str] | None]:
    """For every graded code cell, by grade_id: the (ename, evalue) it ended with, or None."""
    return {str(grade_id(c)): cell_error(c) for c in nb.cells
            if c.cell_type == "code" and is_graded_cell(c)}
