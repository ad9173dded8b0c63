"""Made-up submissions for trying the workflow and for tests: full marks, blank, half done."""

from __future__ import annotations

import copy
import re
from pathlib import Path

import nbformat
from nbformat import NotebookNode

from parlab.grading.base.cells import grade_id, is_answer_cell
from parlab.grading.base.paths import REPO_ROOT, list_modules

# Lines that mark a solution region in the source (nbgrader's ClearSolutions delimiters).
_SOLUTION_DELIMITER = re.compile(r"^\s*#+\s*(BEGIN|END) SOLUTION\s*$")


def _as_notebook(nb: NotebookNode | Path | str) -> NotebookNode:
    if isinstance(nb, (str, Path)):
        return nbformat.read(str(nb), as_version=4)
    return nb


def fake_submission(source_nb: NotebookNode | Path | str,
                    release_nb: NotebookNode | Path | str) -> NotebookNode:
    """A full-marks submission: the release with each answer cell filled from the solutions.

    Answer cells are matched by nbgrader grade_id; their source becomes the solution cell's
    source without the BEGIN/END SOLUTION lines. Everything else, metadata and checksums of
    locked cells included, stays as released, as in a real learner's notebook.
    """
    source, submission = _as_notebook(source_nb), copy.deepcopy(_as_notebook(release_nb))
    answers = {grade_id(c): c.source for c in source.cells if is_answer_cell(c)}
    released = {grade_id(c) for c in submission.cells if is_answer_cell(c)}
    if set(answers) != released:
        raise ValueError(f"answer cells differ between source and release: source has "
                         f"{sorted(map(str, answers))}, release has {sorted(map(str, released))}")
    for cell in submission.cells:
        if is_answer_cell(cell):
            lines = answers[grade_id(cell)].splitlines()
            cell.source = "\n".join(ln for ln in lines if not _SOLUTION_DELIMITER.match(ln))
    return submission


def fake_class(inbox: Path, root: Path = REPO_ROOT) -> list[str]:
    """Three fake students' work for every released module, to try the workflow on:
    alice answers everything (from solutions/), bob hands in the blank release, carol answers
    all but the first exercise. Written as inbox/<student>/<module>.ipynb."""
    made = []
    for module in list_modules(root / "course"):
        name = f"{module}.ipynb"
        release = nbformat.read(str(root / "course" / module / name), as_version=4)
        full = fake_submission(root / "solutions" / module / name, release)
        carol = copy.deepcopy(full)
        first = next(i for i, c in enumerate(release.cells) if is_answer_cell(c))
        carol.cells[first] = copy.deepcopy(release.cells[first])
        for student, nb in (("alice", full), ("bob", release), ("carol", carol)):
            (inbox / student).mkdir(parents=True, exist_ok=True)
            nbformat.write(nb, str(inbox / student / name))
            made.append(f"{student}/{name}")
    return made
