"""One share of a class, made ready for `nbgrader autograde` in a course root of its own.

Every engine grades a share the same way, wherever it runs: a folder holding a copy of the
course's gradebook, a link to solutions/, and the share's submissions (`prepare`), graded by
plain `nbgrader autograde` started there (`command`). Before grading, a notebook that cannot
be read (not JSON, damaged) is replaced, in the share's copy only, by the blank release flagged
`unreadable`, which ResilientExecute scores 0 cell by cell with a message: the student still
gets a gradebook row and feedback.
"""

from __future__ import annotations

import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

import nbformat

from parlab.grading.base.cells import META
from parlab.grading.base.notebooks import unreadable_reason
from parlab.grading.base.startup import NBGRADER
from parlab.grading.engines.record import Pair


@dataclass(frozen=True)
class Job:
    """What every share of one autograde run shares: the course, the release the gradebook
    was made from, a scratch folder for the shares' roots, nbgrader's options, the
    environment every process of the run carries (its token), and the time one submission
    may take."""

    root: Path
    module: str
    release: Path
    work: Path
    nbgrader_args: tuple[str, ...]
    env: dict[str, str]
    per_submission_s: float
    token: str


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


def prepare(job: Job, index: int, share: list[Pair]) -> Path:
    """The course root of share `index`: the gradebook's copy, solutions/, its submissions."""
    wroot = job.work / f"worker{index}"
    wroot.mkdir()
    shutil.copy2(job.root / "gradebook.db", wroot / "gradebook.db")
    (wroot / "solutions").symlink_to(job.root / "solutions")
    for m, s in share:
        dest = wroot / "submitted" / s / m
        shutil.copytree(job.root / "submitted" / s / m, dest, symlinks=False)
        _replace_unreadable(dest, job.release / m)
    return wroot


def command(job: Job, wroot: Path) -> list[str]:
    """`nbgrader autograde` of the share in `wroot`, as the make targets run it (from
    autograder/, so the course's nbgrader_config.py is read)."""
    return [*NBGRADER, "autograde", job.module, "--force", *job.nbgrader_args,
            f"--CourseDirectory.root={wroot}"]


class Engine(Protocol):
    """What does the grading of a class's shares: `LocalWorkers` (this machine), or a batch
    system's array of tasks. It returns, per share, the root `prepare` made (holding its
    gradebook and autograded notebooks) and nbgrader's log, and the pids of processes it had
    to kill after the shares were done."""

    name: str
    workers: int

    def grade(self, job: Job, shares: list[list[Pair]]) -> tuple[list[tuple[Path, str]],
                                                                   list[int]]: ...
