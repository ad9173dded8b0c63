"""What a parallel autograde run found: one `Graded` per submission, the `GradeRun` around them.

Shared by the class driver (parlab.grading.engines.grade), the gradebook reader
(parlab.grading.engines.merge) and the command line; kept apart so that neither imports the
other.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

from parlab.grading.base.procs import processes

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
    # grade_id -> the check's "Likely mistake: ..." diagnosis, for the tests that gave one
    diagnoses: dict[str, str] = field(default_factory=dict)
    # grade_id -> "the notebook's check passed, the verifier's failed" (or the other way):
    # the tests where the learner's kernel and the verifier (parlab.grading.verify) disagreed
    disagreements: dict[str, str] = field(default_factory=dict)
    unverified: dict[str, str] = field(default_factory=dict)  # grade_id -> why not verified


@dataclass
class GradeRun:
    """One run of `autograde_parallel`: every submission it graded, and how the run went."""

    results: list[Graded]
    seconds: float
    workers: int
    leftover: list[int]  # processes of this run alive after the workers ended (then killed)
    logs: list[str]
    token: str = ""  # RUN_ENV value of every process this run started
    unchanged: list[tuple[str, str]] = field(default_factory=list)  # up to date, not graded
    sandbox: bool = True  # False: graded without the sandbox (make autograde UNSAFE=1)

    def get(self, module: str, student: str) -> Graded:
        return next(r for r in self.results if r.module == module and r.student == student)

    def save(self, root: Path) -> None:
        """Write the run's summary to root/autograded/.parlab/last_run.json."""
        path = Path(root) / "autograded" / ".parlab" / "last_run.json"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps({
            "seconds": round(self.seconds, 1), "workers": self.workers,
            "leftover": self.leftover, "token": self.token, "unchanged": self.unchanged,
            "sandbox": self.sandbox,
            "results": [r.__dict__ for r in self.results]}, indent=1, default=str))

    @classmethod
    def load(cls, root: Path) -> GradeRun:
        """The last run's summary, from root/autograded/.parlab/last_run.json (a run that
        found nothing to grade leaves the one before it)."""
        data = json.loads((Path(root) / "autograded" / ".parlab" / "last_run.json").read_text())
        results = [Graded(**{**r, "cells": {k: tuple(v) for k, v in r["cells"].items()}})
                   for r in data["results"]]
        logs = [p.read_text() for p in sorted(
            (Path(root) / "autograded" / ".parlab").glob("worker*.log"))]
        return cls(results, data["seconds"], data["workers"], data["leftover"], logs,
                   data["token"], [tuple(p) for p in data.get("unchanged", [])],
                   data.get("sandbox", True))


def log_warnings(logs: list[str]) -> list[str]:
    """nbgrader's warnings and errors in the workers' logs, each once, in order: what an
    instructor should read (an edited locked cell, a cell put back, a dropped submission).
    The checksum warnings nbgrader logs for every untouched hidden-test cell are not among them
    (parlab.grading.autograde.overwrite drops them at the source)."""
    seen: dict[str, None] = {}
    for log in logs:
        for line in log.splitlines():
            if "| WARNING]" in line or "| ERROR]" in line:
                seen.setdefault(line.strip(), None)
    return list(seen)


def leftover_processes(token: str) -> list[int]:
    """Live processes (other than zombies) whose environment holds RUN_ENV=token."""
    return processes(env=f"{RUN_ENV}={token}")
