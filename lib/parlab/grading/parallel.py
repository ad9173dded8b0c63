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
from parlab.grading.merge import merge, missing_results, read_results
from parlab.grading.notebooks import unreadable_reason
from parlab.grading.paths import AUTOGRADER_DIR
from parlab.grading.record import Pair, fingerprints, stale, update_record
from parlab.grading.results import RUN_ENV, GradeRun, leftover_processes
from parlab.grading.runner import generate_release, submitted
from parlab.grading.sandbox import problem as sandbox_problem
from parlab.grading.startup import NBGRADER


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
    cmd = [*NBGRADER, "autograde", module, "--force", *args,
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


def _select(root: Path, module: str, students: list[str] | None) -> list[Pair]:
    by_module = submitted(root, module)
    return sorted((m, s) for m, names in by_module.items() for s in names
                  if students is None or s in students)


def _missing(root: Path, pairs: list[Pair], release: Path) -> dict[Pair, str]:
    """Pairs whose folder lacks a released notebook: never handed to nbgrader (which would
    fail on them with an error of its own), reported as missing."""
    missing = {}
    for m, s in pairs:
        absent = [nb.name for nb in sorted((release / m).glob("*.ipynb"))
                  if not (root / "submitted" / s / m / nb.name).exists()]
        if absent:
            missing[(m, s)] = (f"MISSING: submitted/{s}/{m}/ has no {', '.join(absent)}; "
                               "collect reports such folders, ask the learner to hand it in")
    return missing


def _run_workers(root: Path, pairs: list[Pair], module: str, release: Path, work: Path,
                 nbgrader_args: tuple[str, ...], workers: int, token: str,
                 worker_timeout: float | None) -> tuple[list[str], list[int]]:
    """Grade `pairs` in `workers` nbgrader processes, merge into root; (logs, leftovers)."""
    env = dict(os.environ, **{RUN_ENV: token})
    env["PATH"] = os.pathsep.join([str(Path(sys.executable).parent), env.get("PATH", "")])
    # Disjoint shares of (module, student) pairs, dealt round-robin so that each worker gets a
    # mix of modules; a student may be graded by two workers, for two different modules.
    groups = [pairs[i::workers] for i in range(min(workers, len(pairs)))]
    per = float(str(config_value("ResilientExecute", "submission_timeout", 900, nbgrader_args)))
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
    folder = root / "autograded" / ".parlab"
    folder.mkdir(parents=True, exist_ok=True)
    for old in folder.glob("worker*.log"):
        old.unlink()
    for i, out in enumerate(logs):
        (folder / f"worker{i}.log").write_text(out)
    return logs, leftover


class SandboxMissing(RuntimeError):
    """No sandbox can be made here, and the instructor did not say UNSAFE=1."""


UNSAFE_ARG = "--ResilientExecute.sandbox=False"


def sandbox_args(nbgrader_args: tuple[str, ...], unsafe: bool) -> tuple[str, ...]:
    """The workers' nbgrader options: UNSAFE_ARG added when `unsafe`; SandboxMissing when
    the configuration asks for a sandbox that cannot be made here (and not `unsafe`)."""
    if unsafe:
        return (*nbgrader_args, UNSAFE_ARG)
    if config_value("ResilientExecute", "sandbox", False, nbgrader_args) and (
            why := sandbox_problem()):
        raise SandboxMissing(
            f"not grading: every submission runs in a sandbox, and none can be made on this "
            f"machine: {why}. Install what is missing (make sandbox), or grade without the "
            f"sandbox, trusting every submission, with `make autograde UNSAFE=1` (recorded "
            f"with the run and shown by make export).")
    return nbgrader_args


def autograde_parallel(root: Path, module: str = "*", *, workers: int = 3,
                       students: list[str] | None = None, nbgrader_args: tuple[str, ...] = (),
                       worker_timeout: float | None = None, token: str | None = None,
                       record: bool = True, regrade_all: bool = False,
                       unsafe: bool = False) -> GradeRun:
    """Autograde submitted/<student>/<module>/ under `root` with `workers` nbgrader processes.

    module: a name or a glob ("*": every submitted module); students: only these. Of those,
    only new or changed submissions are graded (parlab.grading.record), unless regrade_all.
    nbgrader_args: extra options for every worker (e.g. "--Execute.timeout=15").
    worker_timeout: kill a worker after this many seconds (default: ResilientExecute's
    submission_timeout per submission, plus a margin). record: first record the modules in
    the gradebook (generate_assignment into a scratch folder); False when the caller has just
    released them with the gradebook on. unsafe: grade without the sandbox (`make autograde
    UNSAFE=1`); else SandboxMissing when the course asks for one and none can be made.
    """
    start = time.perf_counter()
    nbgrader_args = sandbox_args(tuple(nbgrader_args), unsafe)
    root = Path(root).resolve()
    selected = _select(root, module, students)
    now = fingerprints(root, selected, nbgrader_args)
    pairs = selected if regrade_all else stale(root, selected, now)
    unchanged = sorted(set(selected) - set(pairs))
    token = token or uuid.uuid4().hex
    if not pairs:
        return GradeRun([], 0.0, 0, [], [], token, unchanged)
    with tempfile.TemporaryDirectory(prefix="parlab-grade-") as tmp:
        work = Path(tmp)
        # Record every submitted module (cells, points, hidden tests) in the gradebook; the
        # release goes to a scratch folder so course/ is never touched by grading.
        release = work / "release" if record else root / "course"
        if record:
            generate_release(module, root=root, release_dir=release, database=True)
        missing = _missing(root, pairs, release)
        graded = [p for p in pairs if p not in missing]
        logs, leftover = ([], []) if not graded else _run_workers(
            root, graded, module, release, work, nbgrader_args, workers, token, worker_timeout)
    results = read_results(root, graded, logs) + missing_results(root, missing)
    results.sort(key=lambda r: (r.module, r.student))
    run = GradeRun(results, time.perf_counter() - start, min(workers, len(graded)), leftover,
                   logs, token, unchanged)
    run.sandbox = not unsafe
    update_record(root, results, now, unsafe=unsafe)
    run.save(root)
    return run
