"""The course run (tests/grading_runs.py) in a process of its own, started as the session starts.

The course run is the suite's largest piece of work (every module autograded for alice and
bob, about a quarter of the wall time), and it keeps both cores busy. Many other tests keep
one core busy, or none (a launcher waiting out a deadlock): measured over a whole `make test`
on 2 cores, they left 450 core-seconds idle. So conftest.py starts the course run when
collection ends, in this module's `main`, and runs the tests that use at most about one core
first (conftest's ALONGSIDE), on what the course run leaves; the tests that read the course
run come next (the `course_run` fixture waits for it and loads its result), then the rest.

Two settings keep the two from slowing each other beyond their limits:
- the course run is niced (NICE), so a test's own process, and its ranks, get the CPU when
  they want it: the tests' launcher timeouts and timing tolerances hold as in a quiet run;
- it grades with WORKERS = 2 instead of the 3 of a run alone, so each notebook gets about the
  CPU share it has alone, and every cell stays as far from nbgrader's 60 s cell timeout.

    python tests/background.py <root> <result.pickle>     (what `start` runs)

The process and everything below it are not a test's processes: conftest's `no_orphans`
leaves them out (`tree`).
"""

from __future__ import annotations

import os
import pickle
import subprocess
import sys
import time
from pathlib import Path

TESTS_DIR = Path(__file__).resolve().parent
WAIT_S = 1800  # the course run alone takes about 4 minutes on 2 cores
NICE = 10
WORKERS = 2


class Background:
    """A course run building in a child process: `result()` waits and returns its CourseRun."""

    def __init__(self, root: Path) -> None:
        self.root, self.out = root, root.parent / f"{root.name}.pickle"
        self.log = root.parent / f"{root.name}.log"
        self.started = time.perf_counter()
        with self.log.open("w") as log:
            self.proc = subprocess.Popen([sys.executable, __file__, str(root), str(self.out)],
                                         stdout=log, stderr=subprocess.STDOUT,
                                         cwd=TESTS_DIR.parent, start_new_session=True)

    def tree(self) -> set[int]:
        """The process and its descendants, while it runs (conftest's `descendants`)."""
        from conftest import descendants

        return {self.proc.pid, *descendants(self.proc.pid)} if self.proc.poll() is None else set()

    def result(self):  # -> grading_runs.CourseRun
        try:
            code = self.proc.wait(timeout=WAIT_S)
        except subprocess.TimeoutExpired:
            self.stop()
            raise RuntimeError(f"the course run took over {WAIT_S} s (log: {self.log})") from None
        if code != 0 or not self.out.exists():
            tail = self.log.read_text(errors="replace")[-4000:]
            raise RuntimeError(f"the course run exited with {code}:\n{tail}")
        with self.out.open("rb") as f:
            return pickle.load(f)

    def stop(self) -> None:
        """End it (and its process group) if it still runs: the session is over."""
        if self.proc.poll() is None:
            try:
                os.killpg(self.proc.pid, 9)
            except ProcessLookupError:
                pass
            self.proc.wait()


def main(root: str, out: str) -> None:
    os.nice(NICE)  # inherited by every kernel and rank it starts
    sys.path.insert(0, str(TESTS_DIR))
    import grading_runs  # imported by name, so the pickle names grading_runs.CourseRun

    run = grading_runs.course_run(Path(root), workers=WORKERS)
    Path(out).write_bytes(pickle.dumps(run))


if __name__ == "__main__":
    main(*sys.argv[1:3])
