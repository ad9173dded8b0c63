"""The local engine: a class's shares graded by worker processes on this machine.

Each of `workers` threads starts one `nbgrader autograde` (parlab.grading.engines.share) in its
share's root and waits for it, killing it past its time; the run's processes carry the run's
token, so whatever survived the workers (none should) is found by it and killed, and counted.
Kernels of concurrent workers cannot clash on ports for the ranks: the launcher rendezvouses
through a file store.
"""

from __future__ import annotations

import os
import signal
import subprocess
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from parlab.grading.base.paths import AUTOGRADER_DIR
from parlab.grading.engines.record import Pair
from parlab.grading.engines.results import leftover_processes
from parlab.grading.engines.share import Job, command, prepare


def _grade_share(job: Job, index: int, share: list[Pair], timeout: float) -> tuple[Path, str]:
    """Grade one share; (its root, nbgrader's log)."""
    wroot = prepare(job, index, share)
    # The log goes to a file, not a pipe: a process a learner started and left running would
    # hold a pipe open, and reading it to the end would wait for that process.
    log = wroot / "autograde.log"
    with open(log, "w") as out:
        proc = subprocess.Popen(command(job, wroot), cwd=AUTOGRADER_DIR, env=job.env,
                                stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
        try:
            proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
            out.write(f"\n[parlab] worker {index} killed after {timeout:.0f} s\n")
    return wroot, log.read_text(errors="replace")


class LocalWorkers:
    """`workers` nbgrader processes at once on this machine (`make autograde WORKERS=3`)."""

    name = "local"

    def __init__(self, workers: int = 3, *, timeout: float | None = None) -> None:
        self.workers = workers
        self.timeout = timeout  # seconds a worker may take; default: its share's submissions

    def grade(self, job: Job, shares: list[list[Pair]]) -> tuple[list[tuple[Path, str]],
                                                                   list[int]]:
        """Grade every share; ((root, log) per share, the pids killed after the workers)."""
        limit = self.timeout or max(len(s) for s in shares) * (job.per_submission_s + 60) + 120
        with ThreadPoolExecutor(max_workers=len(shares)) as pool:
            done = list(pool.map(lambda ix: _grade_share(job, ix[0], ix[1], limit),
                                 enumerate(shares)))
        leftover = leftover_processes(job.token)
        for pid in leftover:
            try:
                os.kill(pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
        return done, leftover
