"""Autograde a whole class on an engine, without losing a row.

nbgrader grades one submission after another, and its sqlite gradebook is not safe for
several writers. So a class is dealt into disjoint shares of (module, student) pairs, each
graded by plain `nbgrader autograde` (the real path, our autograder/nbgrader_config.py
included) in a course root of its own with its own copy of the gradebook, by an engine
(parlab.grading.engines.local, or a batch system's); when all are done, one process copies
their scores and comments into the course's gradebook (`merge`) and moves their autograded
notebooks into place. Whatever the engine, the same selection (only what changed, unless
asked), the same release into the gradebook, the same merge and the same record.

Every process started for a run carries PARLAB_GRADE_RUN=<token> in its environment; what
survived the shares is found by it, killed and counted in the result
(parlab.grading.engines.results).
"""

from __future__ import annotations

import os
import sys
import tempfile
import time
import uuid
from pathlib import Path

from parlab.grading.base.config import config_value
from parlab.grading.base.runner import generate_release, submitted
from parlab.grading.engines.local import LocalWorkers
from parlab.grading.engines.merge import merge, missing_results, read_results
from parlab.grading.engines.record import Pair, fingerprints, stale, update_record
from parlab.grading.engines.results import RUN_ENV, GradeRun
from parlab.grading.engines.share import Engine, Job
from parlab.grading.sandbox import problem as sandbox_problem


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


def _grade(job: Job, pairs: list[Pair], engine: Engine) -> tuple[list[str], list[int]]:
    """Grade `pairs` on `engine`, merge into the course's gradebook; (logs, leftovers)."""
    # Disjoint shares of (module, student) pairs, dealt round-robin so that each share gets a
    # mix of modules; a student may be graded in two shares, for two different modules.
    shares = [pairs[i::engine.workers] for i in range(min(engine.workers, len(pairs)))]
    done, leftover = engine.grade(job, shares)
    for wroot, _ in done:  # one writer: the course's gradebook is only touched here
        merge(wroot, job.root)
    logs = [out for _, out in done]
    folder = job.root / "autograded" / ".parlab"
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
    """The shares' nbgrader options: UNSAFE_ARG added when `unsafe`; SandboxMissing when
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
                       unsafe: bool = False, engine: Engine | None = None) -> GradeRun:
    """Autograde submitted/<student>/<module>/ under `root` on `engine` (default: `workers`
    nbgrader processes on this machine, each killed after `worker_timeout` seconds, by
    default ResilientExecute's submission_timeout per submission plus a margin).

    module: a name or a glob ("*": every submitted module); students: only these. Of those,
    only new or changed submissions are graded (parlab.grading.engines.record), unless
    regrade_all. nbgrader_args: extra options for every share (e.g. "--Execute.timeout=15").
    record: first record the modules in the gradebook (generate_assignment into a scratch
    folder); False when the caller has just released them with the gradebook on. unsafe:
    grade without the sandbox (`make autograde UNSAFE=1`); else SandboxMissing when the
    course asks for one and none can be made.
    """
    start = time.perf_counter()
    engine = engine or LocalWorkers(workers, timeout=worker_timeout)
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
        env = dict(os.environ, **{RUN_ENV: token})
        env["PATH"] = os.pathsep.join([str(Path(sys.executable).parent), env.get("PATH", "")])
        per = float(str(config_value("ResilientExecute", "submission_timeout", 900,
                                     nbgrader_args)))
        job = Job(root, module, release, work, nbgrader_args, env, per, token)
        logs, leftover = ([], []) if not graded else _grade(job, graded, engine)
    results = read_results(root, graded, logs) + missing_results(root, missing)
    results.sort(key=lambda r: (r.module, r.student))
    run = GradeRun(results, time.perf_counter() - start, min(engine.workers, len(graded)),
                   leftover, logs, token, unchanged)
    run.sandbox = not unsafe
    update_record(root, results, now, unsafe=unsafe)
    run.save(root)
    return run
