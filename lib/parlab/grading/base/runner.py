"""nbgrader's command line, run the way the make targets run it, and the scores it records.

Every nbgrader step runs as the command line does (`nbgrader ...` from autograder/, so
autograder/nbgrader_config.py applies; started as parlab.grading.base.startup.NBGRADER, which is
nbgrader's own main about 1 s sooner); another course root, such as a temporary copy in a
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

import fnmatch
import logging
import os
import subprocess
import sys
import time
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from nbgrader.api import Gradebook, MissingEntry

from parlab.grading.base.paths import AUTOGRADER_DIR, REPO_ROOT, list_modules
from parlab.grading.base.startup import NBGRADER

log = logging.getLogger(__name__)


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


def run_nbgrader(*args: str, root: Path = REPO_ROOT, check: bool = True,
                 timeout: float | None = None) -> NbgraderRun:
    """Run `nbgrader <args> --CourseDirectory.root=<root>` from autograder/ and time it."""
    root_arg = f"--CourseDirectory.root={Path(root).resolve()}"
    cmd = [*NBGRADER, *args, root_arg]
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
