"""The two shared autograde runs (tests/grading_runs.py), each in a process of its own.

The course run is the suite's largest piece of work (every module autograded for alice and
bob, about a quarter of the wall time), and it keeps both cores busy. Many other tests keep
one core busy, or none (a launcher waiting out a deadlock): measured over a whole `make test`
on 2 cores, they left 450 core-seconds idle. So conftest.py starts the course run when
collection ends and runs the tests that use at most about one core first (conftest's
ALONGSIDE), on what the course run leaves; the tests that read the course run come next (the
`course_run` fixture waits for it and loads its result). When it is done, the fault run starts
the same way, and builds while the other tests run; the tests that read it come last.

    python tests/background.py course|fault <root> <result.pickle>     (what `Background` runs)

Each run's settings keep it within its limits beside the tests:
- it is niced (NICE), as is everything it starts;
- the course run grades with COURSE_WORKERS = 2 instead of the 3 of a run alone, so each
  notebook gets about the CPU share it has alone, and every cell stays as far from nbgrader's
  60 s cell timeout (its slowest cell took 18 s beside the tests, 37 s alone with 3 workers).

The processes of a run are not a test's processes: conftest's `no_orphans` leaves them out
(`Background.tree`).
"""

from __future__ import annotations

import os
import pickle
import subprocess
import sys
import time
from pathlib import Path

TESTS_DIR = Path(__file__).resolve().parent
WAIT_S = 1800  # the course run alone takes about 4 minutes on 2 cores, the fault run 1
NICE = 10
COURSE_WORKERS = 2


class Background:
    """The `kind` run ("course" or "fault") building in a child process under `root`;
    `result()` waits for it and returns its grading_runs.CourseRun."""

    def __init__(self, kind: str, root: Path) -> None:
        self.kind, self.out = kind, root.parent / f"{root.name}.pickle"
        self.log = root.parent / f"{root.name}.log"
        self.started = time.perf_counter()
        with self.log.open("w") as log:
            self.proc = subprocess.Popen(
                [sys.executable, __file__, kind, str(root), str(self.out)], stdout=log,
                stderr=subprocess.STDOUT, cwd=TESTS_DIR.parent, start_new_session=True)

    def tree(self) -> set[int]:
        """The process and its descendants, while it runs (conftest's `descendants`)."""
        from conftest import descendants

        return {self.proc.pid, *descendants(self.proc.pid)} if self.proc.poll() is None else set()

    def result(self):  # -> grading_runs.CourseRun
        try:
            code = self.proc.wait(timeout=WAIT_S)
        except subprocess.TimeoutExpired:
            self.stop()
            raise RuntimeError(f"the {self.kind} run took over {WAIT_S} s (log: {self.log})"
                               ) from None
        if code != 0 or not self.out.exists():
            tail = self.log.read_text(errors="replace")[-4000:]
            raise RuntimeError(f"the {self.kind} run exited with {code}:\n{tail}")
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


def main(kind: str, root: str, out: str) -> None:
    os.nice(NICE)  # inherited by every kernel and rank it starts
    sys.path.insert(0, str(TESTS_DIR))
    import grading_runs  # imported by name, so the pickle names grading_runs.CourseRun

    where = Path(root)
    if kind == "course":
        run = grading_runs.course_run(where, workers=COURSE_WORKERS)
    else:
        (where / "inbox").mkdir(parents=True)
        run = grading_runs.fault_run(where / "class", where / "inbox")
    Path(out).write_bytes(pickle.dumps(run))


if __name__ == "__main__":
    main(*sys.argv[1:4])
