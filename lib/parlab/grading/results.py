"""What a parallel autograde run found: one `Graded` per submission, the `GradeRun` around them.

Shared by the workers' driver (parlab.grading.parallel), the gradebook reader
(parlab.grading.merge) and the command line; kept apart so that neither imports the other.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

from parlab.grading.procs import processes

RUN_ENV = "PARLAB_GRADE_RUN"  # set to a fresh token in the environment of a run's processes


@dataclass
class Graded:
    """One (module, student): score from the gradebook, and how the grading went."""

    module: str
    student: str
    score: float | None  # None: nbgrader left no autograded notebook (see `status`)
    max_score: float
    status: str  # "graded", "graded (unreadable notebook)", or why it was not
    seconds: float | None = None  # execution time, from the notebook's metadata
    restarts: int = 0
    # grade_id -> (score, what the learner reads)
    cells: dict[str, tuple[float | None, str]] = field(default_factory=dict)


@dataclass
class GradeRun:
    """One run of `autograde_parallel`: every submission it graded, and how the run went."""

    results: list[Graded]
    seconds: float
    workers: int
    leftover: list[int]  # processes of this run alive after the workers ended (then killed)
    logs: list[str]
    token: str = ""  # RUN_ENV value of every process this run started

    def get(self, module: str, student: str) -> Graded:
        return next(r for r in self.results if r.module == module and r.student == student)

    @classmethod
    def load(cls, root: Path) -> GradeRun:
        """The last run's summary, from root/autograded/.parlab/last_run.json."""
        data = json.loads((Path(root) / "autograded" / ".parlab" / "last_run.json").read_text())
        results = [Graded(**{**r, "cells": {k: tuple(v) for k, v in r["cells"].items()}})
                   for r in data["results"]]
        logs = [p.read_text() for p in sorted(
            (Path(root) / "autograded" / ".parlab").glob("worker*.log"))]
        return cls(results, data["seconds"], data["workers"], data["leftover"], logs,
                   data["token"])


def leftover_processes(token: str) -> list[int]:
    """Live processes (other than zombies) whose environment holds RUN_ENV=token."""
    return processes(env=f"{RUN_ENV}={token}")
