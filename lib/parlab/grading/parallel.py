"""Autograde a whole class with a fixed number of parallel workers, without losing a row.

nbgrader grades one submission after another, and its sqlite gradebook is not safe for
several writers. Here each of `workers` processes runs plain `nbgrader autograde` (the real
path, our autograder/nbgrader_config.py included) on a disjoint set of students, in its own
temporary course root with its own copy of the gradebook; when all are done, one process
copies their scores and comments into the course's gradebook (`merge`) and moves their
autograded notebooks into place. Kernels of concurrent workers cannot clash on ports for the
ranks: the launcher rendezvouses through a file store.

Before grading, a notebook that cannot be read (not JSON, damaged) is replaced, in the
worker's copy only, by the blank release flagged `unreadable`, which ResilientExecute scores 0
cell by cell with a message: the student still gets a gradebook row and feedback.

Every process started for a run carries PARLAB_GRADE_RUN=<token> in its environment; after
the workers end, `leftover_processes(token)` finds any that survived (none should), and they
are killed and counted in the result (parlab.grading.results).
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import nbformat

from parlab.grading.cells import META
from parlab.grading.config import config_value
from parlab.grading.merge import merge, read_results
from parlab.grading.notebooks import unreadable_reason
from parlab.grading.paths import AUTOGRADER_DIR
from parlab.grading.results import RUN_ENV, GradeRun, leftover_processes
from parlab.grading.runner import generate_release, submitted


def _replace_unreadable(folder: Path, release: Path) -> list[str]:
    """Swap each unreadable notebook in `folder` for the flagged blank release; their names."""
    swapped = []
    for blank in sorted(release.glob("*.ipynb")):
        path = folder / blank.name
        if not path.exists() or (why := unreadable_reason(path)) is None:
            continue
        nb = nbformat.read(str(blank), as_version=4)
        nb.metadata[META] = {"unreadable": (
            f"your file {blank.name} is not a valid notebook ({why}), so none of it could be "
            "run and every test in it scores 0. It was probably damaged while saving, or by an "
            "edit outside JupyterLab. Open it in JupyterLab, which says what is wrong, repair "
            f"it (or start again from course/{folder.name}/{blank.name}) and submit again.")}
        path.rename(path.with_name(path.name + ".unreadable"))
        nbformat.write(nb, str(path))
        swapped.append(blank.name)
    return swapped


def _worker(index: int, root: Path, share: list[tuple[str, str]], module: str, release: Path,
            work: Path, args: list[str], env: dict, timeout: float) -> tuple[Path, str]:
    """Grade `share` ((module, student) pairs) in a private course root; return (that root,
    nbgrader's log)."""
    wroot = work / f"worker{index}"
    wroot.mkdir()
    shutil.copy2(root / "gradebook.db", wroot / "gradebook.db")
    (wroot / "solutions").symlink_to(root / "solutions")
    for m, s in share:
        dest = wroot / "submitted" / s / m
        shutil.copytree(root / "submitted" / s / m, dest, symlinks=False)
        _replace_unreadable(dest, release / m)
    cmd = [sys.executable, "-m", "nbgrader", "autograde", module, "--force", *args,
           f"--CourseDirectory.root={wroot}"]
    # The log goes to a file, not a pipe: a process a learner started and left running would
    # hold a pipe open, and reading it to the end would wait for that process.
    log = wroot / "autograde.log"
    with open(log, "w") as out:
        proc = subprocess.Popen(cmd, cwd=AUTOGRADER_DIR, env=env, stdout=out,
                                stderr=subprocess.STDOUT, start_new_session=True)
        try:
            proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
            out.write(f"\n[parlab] worker {index} killed after {timeout:.0f} s\n")
    return wroot, log.read_text(errors="replace")


def autograde_parallel(root: Path, module: str = "*", *, workers: int = 3,
                       students: list[str] | None = None, nbgrader_args: tuple[str, ...] = (),
                       worker_timeout: float | None = None, token: str | None = None,
                       record: bool = True) -> GradeRun:
    """Autograde submitted/<student>/<module>/ under `root` with `workers` nbgrader processes.

    module: a name or a glob ("*": every submitted module). nbgrader_args: extra options for
    every worker (e.g. "--Execute.timeout=15"). worker_timeout: kill a worker after this many
    seconds (default: ResilientExecute's submission_timeout per submission, plus a margin).
    record: first record the modules in the gradebook (generate_assignment into a scratch
    folder); False when the caller has just released them with the gradebook on.
    """
    start = time.perf_counter()
    root = Path(root).resolve()
    by_module = submitted(root, module)
    pairs = sorted((m, s) for m, names in by_module.items() for s in names
                   if students is None or s in students)
    if not pairs:
        return GradeRun([], 0.0, workers, [], [], "")
    token = token or uuid.uuid4().hex
    env = dict(os.environ, **{RUN_ENV: token})
    env["PATH"] = os.pathsep.join([str(Path(sys.executable).parent), env.get("PATH", "")])
    # Disjoint shares of (module, student) pairs, dealt round-robin so that each worker gets a
    # mix of modules; a student may be graded by two workers, for two different modules.
    groups = [pairs[i::workers] for i in range(min(workers, len(pairs)))]
    with tempfile.TemporaryDirectory(prefix="parlab-grade-") as tmp:
        work = Path(tmp)
        # Record every submitted module (cells, points, hidden tests) in the gradebook; the
        # release goes to a scratch folder so course/ is never touched by grading.
        release = work / "release" if record else root / "course"
        if record:
            generate_release(module, root=root, release_dir=release, database=True)
        per = float(config_value("ResilientExecute", "submission_timeout", 900, nbgrader_args))
        limit = worker_timeout or max(len(g) for g in groups) * (per + 60) + 120
        with ThreadPoolExecutor(max_workers=len(groups)) as pool:
            done = list(pool.map(lambda ig: _worker(
                ig[0], root, ig[1], module, release, work, list(nbgrader_args), env, limit),
                enumerate(groups)))
        leftover = leftover_processes(token)
        for pid in leftover:
            try:
                os.kill(pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
        for wroot, _ in done:  # one writer: the main gradebook is only touched here
            merge(wroot, root)
        logs = [out for _, out in done]
        (root / "autograded" / ".parlab").mkdir(parents=True, exist_ok=True)
        for old in (root / "autograded" / ".parlab").glob("worker*.log"):
            old.unlink()
        for i, out in enumerate(logs):
            (root / "autograded" / ".parlab" / f"worker{i}.log").write_text(out)
    results = read_results(root, pairs, logs)
    run = GradeRun(results, time.perf_counter() - start, len(groups), leftover, logs, token)
    (root / "autograded" / ".parlab" / "last_run.json").write_text(json.dumps({
        "seconds": round(run.seconds, 1), "workers": run.workers, "leftover": leftover,
        "token": token,
        "results": [r.__dict__ for r in results]}, indent=1, default=str))
    return run
