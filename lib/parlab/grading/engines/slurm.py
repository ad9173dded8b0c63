"""The Slurm engine: a class's shares graded as one job array, merged by a dependent job.

`make autograde ENGINE=slurm` (`SlurmArray(tasks, at_once=...)`) makes each share ready
(parlab.grading.engines.share.prepare) in a run folder on the course's own storage,
autograded/.parlab/slurm/<token>/, which every node must see, then submits
autograder/cluster/autograde.sbatch twice (read it: it is what runs on the nodes):

    sbatch --array=0-<N-1>%<K> --time --mem --cpus-per-task ...   # task i grades share i
    sbatch --dependency=afterany:<array> ...                      # the merge, after them all

Each task grades its share on node-local disk with plain `nbgrader autograde` (the sandbox and
the verifier, as on one machine; a node that cannot make the sandbox fails the task, saying
why) and copies its gradebook and notebooks back; the merge step
merges the finished shares into gradebook.db (`merge-shares`, the same
parlab.grading.engines.merge.merge_shares as a local run). Meanwhile this process prints the
tasks pending, running and done whenever that changes, from squeue and the tasks' own files.

A task that did not finish (cancelled, killed at its --time or --mem, its node lost) is named
with its students and Slurm's state; its submissions are left ungraded (an older graded
notebook of theirs removed: it would read as this submission's grade), so the next run grades
just them. The limits come from Slurm: --time as a local worker's, --mem the sandbox's
memory_limit plus 2 GiB for nbgrader and the verifier, --cpus-per-task 2; the site's options
(partition, account) and any override come last, from SBATCH_ARGS.

Ending: Ctrl-C or SIGTERM/SIGHUP while waiting cancels the run's jobs; a run that was killed
outright leaves its folder, and the next run cancels its jobs and removes it (each task, when
Slurm ends it, kills every process of it left on its node: autograde.sbatch's clean-up).
"""

from __future__ import annotations

import math
import os
import shutil
import signal
import socket
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import replace
from pathlib import Path

from parlab.grading.base.config import config_value
from parlab.grading.base.paths import AUTOGRADER_DIR
from parlab.grading.engines import queue
from parlab.grading.engines.merge import MERGED
from parlab.grading.engines.record import Pair
from parlab.grading.engines.share import Job, command, prepare

SCRIPT = AUTOGRADER_DIR / "cluster" / "autograde.sbatch"
GRADER_MEMORY_MB = 2048  # nbgrader and the verifier, beside the submission's memory_limit


def runs_folder(root: Path) -> Path:
    return Path(root) / "autograded" / ".parlab" / "slurm"


def finished_shares(run: Path) -> list[Path]:
    """The shares of `run` whose task finished (wrote its exit status), by index."""
    done = [p.with_suffix("") for p in run.glob("worker*.exit")]
    return sorted(done, key=lambda p: int(p.name.removeprefix("worker")))


class SlurmArray:
    """The shares as the tasks of one Slurm job array, `at_once` running at a time."""

    name = "slurm"

    def __init__(self, tasks: int = 16, *, at_once: int = 3, cpus: int = 2,
                 sbatch_args: tuple[str, ...] = (), poll_s: float = 2.0,
                 say: Callable[[str], None] = lambda line: print(line, flush=True)) -> None:
        self.workers = tasks  # the array's size: how many shares the class is dealt into
        self.at_once, self.cpus, self.sbatch_args = at_once, cpus, sbatch_args
        self.poll_s, self.say = poll_s, say

    def grade(self, job: Job, shares: list[list[Pair]]) -> tuple[list[tuple[Path, str]],
                                                                   list[int]]:
        """Submit, wait, and return every share's (root, log); no process to kill here (each
        task ends its own on its node)."""
        run = runs_folder(job.root) / job.token
        end_earlier_runs(run.parent)
        run.mkdir(parents=True)
        (run / "token").write_text(job.token)
        (run / "owner").write_text(f"{socket.gethostname()} {os.getpid()}")
        if config_value("ResilientExecute", "sandbox", False, job.nbgrader_args):
            (run / "sandboxed").touch()  # each task checks that its node can make one
        on_run = replace(job, work=run)
        for i, share in enumerate(shares):
            wroot = prepare(on_run, i, share)
            args = [a for a in command(on_run, wroot) if not a.startswith("--CourseDirectory.")]
            (run / f"worker{i}.args").write_text("\0".join(args) + "\0")
        array, merge = self._submit(job, run, shares)
        with _cancelled_on_signal(array, merge, self.say):
            self._wait(run, array, merge, len(shares))
        return [self._result(job, run, array, i, share) for i, share in enumerate(shares)], []

    def _submit(self, job: Job, run: Path, shares: list[list[Pair]]) -> tuple[int, int]:
        limit_s = max(len(s) for s in shares) * (job.per_submission_s + 60) + 120
        memory = int(str(config_value("ResilientExecute", "memory_limit", 6 << 30,
                                      job.nbgrader_args)))
        script = [str(SCRIPT), str(run), str(AUTOGRADER_DIR), sys.executable, str(job.root)]
        array = queue.sbatch(
            f"--array=0-{len(shares) - 1}%{self.at_once}", f"--time={math.ceil(limit_s / 60)}",
            f"--mem={memory // 2**20 + GRADER_MEMORY_MB}M", f"--cpus-per-task={self.cpus}",
            f"--output={run}/worker%a.out", *self.sbatch_args, *script)
        (run / "jobs").write_text(f"{array}\n")
        try:
            merge = queue.sbatch(f"--dependency=afterany:{array}", "--time=30", "--mem=2G",
                                 f"--output={run}/merge.out", *self.sbatch_args, *script)
        except queue.SlurmError:
            queue.cancel(array)
            raise
        (run / "jobs").write_text(f"{array}\n{merge}\n")
        self.say(f"submitted {len(shares)} tasks as Slurm job {array} ({self.at_once} at once), "
                 f"the merge as job {merge}; folder {run}")
        return array, merge

    def _wait(self, run: Path, array: int, merge: int, tasks: int) -> None:
        """Until neither job is queued; a line of progress whenever it changes."""
        start, last = time.monotonic(), ""
        silent: float | None = None  # since when squeue has not answered
        said = False
        while True:
            queued = queue.queued(array, merge)
            if queued is None:  # the controller did not answer: ask again
                if silent is None:
                    silent = time.monotonic()
                elif time.monotonic() - silent > 60 and not said:
                    self.say("squeue has not answered for a minute; still waiting (Ctrl-C "
                             "cancels the run's jobs)")
                    said = True
                time.sleep(self.poll_s)
                continue
            silent = None
            done = {i for i in range(tasks) if (run / f"worker{i}.exit").exists()}
            states = {i: queued.get(f"{array}_{i}") for i in range(tasks)}
            pending = sum(s in queue.WAITING for i, s in states.items() if i not in done)
            running = sum(s is not None and s not in queue.WAITING
                          for i, s in states.items() if i not in done)
            lost = tasks - len(done) - pending - running
            line = (f"job {array}: {pending} pending, {running} running, {len(done)} done"
                    + (f", {lost} ended without finishing" if lost else "")
                    + (f"; merge {queued[str(merge)].lower()}" if str(merge) in queued else ""))
            if line != last:
                self.say(f"[{time.monotonic() - start:5.0f} s] {line}")
                last = line
            if not queued:
                return
            time.sleep(self.poll_s)

    def _result(self, job: Job, run: Path, array: int, i: int, share: list[Pair]
                ) -> tuple[Path, str]:
        wroot, log_path = run / f"worker{i}", run / f"worker{i}.log"
        log = log_path.read_text(errors="replace") if log_path.exists() else ""
        if (run / f"worker{i}.exit").exists():
            return wroot, log
        names = ", ".join(f"{s}/{m}" for m, s in share)
        said = [ln.removeprefix("[parlab] ") for ln in log.splitlines()
                if ln.startswith("[parlab] ")]  # what the task said of its end, if anything
        why = (f"[parlab] slurm task {array}_{i} {queue.explain(queue.final_state(array, i))}"
               + (f" ({said[-1]})" if said else "")
               + f"; not graded: {names}; the next `make autograde ENGINE=slurm` grades them")
        self.say(why)
        for m, s in share:  # an older graded notebook would read as this submission's grade
            shutil.rmtree(job.root / "autograded" / s / m, ignore_errors=True)
        (wroot / MERGED).touch()  # nothing of it to merge: its gradebook never came back
        return wroot, f"{log}\n{why}\n"


def end_earlier_runs(folder: Path, timeout: float = 60) -> None:
    """Cancel the jobs of every earlier run of this course and remove its folder; refuse
    (SlurmError) when an earlier run's process is still waiting on this host."""
    if not folder.is_dir():
        return
    for earlier in sorted(folder.iterdir()):
        host, _, pid = (earlier / "owner").read_text().partition(" ") if (
            earlier / "owner").exists() else ("", "", "")
        if host == socket.gethostname() and pid.isdigit() and _alive(int(pid)):
            raise queue.SlurmError(f"another `make autograde ENGINE=slurm` (pid {pid}) is grading "
                               f"this course; wait for it to end, or end it (kill {pid})")
        jobs = [int(j) for j in (earlier / "jobs").read_text().split()] if (
            earlier / "jobs").exists() else []
        queue.cancel(*jobs)
        deadline = time.monotonic() + timeout
        while jobs and queue.queued(*jobs) != {} and time.monotonic() < deadline:
            time.sleep(1)
        shutil.rmtree(earlier, ignore_errors=True)


def _alive(pid: int) -> bool:
    """Whether `pid` is a live grading command (not a process that reused the number)."""
    try:
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return False
    return pid != os.getpid() and b"parlab.grading" in cmdline


@contextmanager
def _cancelled_on_signal(array: int, merge: int, say: Callable[[str], None]) -> Iterator[None]:
    """While waiting: SIGTERM and SIGHUP read as Ctrl-C, and either cancels the run's jobs."""
    def interrupt(signum: int, frame: object) -> None:
        raise KeyboardInterrupt(signal.Signals(signum).name)

    main = threading.current_thread() is threading.main_thread()
    old = {s: signal.signal(s, interrupt) for s in (signal.SIGTERM, signal.SIGHUP)} if main \
        else {}
    try:
        yield
    except KeyboardInterrupt:
        queue.cancel(array, merge)
        say(f"interrupted: Slurm jobs {array} and {merge} cancelled; nothing was merged that "
            "the merge step had not merged already")
        raise
    finally:
        for s, handler in old.items():
            signal.signal(s, handler)
