"""A learner's workspace across releases: notice an older copy, carry its answers over.

    make lab                                 # says which workspace notebooks are out of date
    make update MODULE=02_tensor_parallel    # = python -m parlab.grading update 02_tensor_parallel

`make lab` copies each released module of course/ into workspace/ once; a later release of a
module the learner has started is not copied over their work. Instead `stale()` compares each
workspace notebook with its release: every cell nbgrader does not let the learner write in
(the text, the demonstrations, the locked tests) must be there, in order (cells the learner
added in between are theirs). When one is not, the release is newer (or the learner edited
it), and `update()`:

1. keeps the learner's file as `<module>.before-update-<time>.ipynb` beside it;
2. writes the new release's notebook in its place, with every answer cell (nbgrader
   `solution: true`, code or markdown) filled from the old notebook's cell of the same
   grade id: answers travel by grade id, so cells may move, be added or be reworded around them;
3. appends the cells the learner added themselves at the end, under a note (a cell with no
   nbgrader id whose cell id and text are not the new release's: release cells keep their ids
   from release to release), and reports the answer cells the new release no longer has
   (they stay in the backup).

Outputs are cleared (run the notebook again); nothing in course/ is written.
"""

from __future__ import annotations

import datetime as dt
import shutil
from dataclasses import dataclass, field
from pathlib import Path

import nbformat
from nbformat import NotebookNode

from parlab.grading.base.cells import grade_id, is_answer_cell
from parlab.grading.base.paths import COURSE_DIR, WORKSPACE_DIR, list_modules

__all__ = ["Update", "up_to_date", "stale", "update", "stale_message", "merge"]
ADDED_NOTE = ("**Cells you added in the previous release of this notebook**, carried over by "
              "`make update`: move them where you want them.")


def _fixed(nb: NotebookNode) -> list[NotebookNode]:
    """The cells a learner does not write in: text, demonstrations, locked tests."""
    return [c for c in nb.cells if grade_id(c) is None or not is_answer_cell(c)]


def up_to_date(mine: NotebookNode, release: NotebookNode) -> bool:
    """Whether every fixed cell of the release is in the learner's notebook, in order (cells
    the learner added in between are theirs and do not count)."""
    pending = iter((c.cell_type, c.source) for c in mine.cells)
    return all(any(seen == want for seen in pending)
               for want in ((c.cell_type, c.source) for c in _fixed(release)))


def stale(workspace: Path = WORKSPACE_DIR, course: Path = COURSE_DIR) -> list[str]:
    """Modules whose workspace notebook is not the current release's (answers aside)."""
    found = []
    for module in list_modules(course):
        mine = workspace / module / f"{module}.ipynb"
        if not mine.exists():
            continue
        try:
            old = nbformat.read(mine, as_version=4)
        except Exception:  # noqa: BLE001 - an unreadable copy is not ours to judge here
            continue
        new = nbformat.read(course / module / f"{module}.ipynb", as_version=4)
        if not up_to_date(old, new):
            found.append(module)
    return found


def stale_message(modules: list[str]) -> str:
    lines = [f"  workspace/{m}/ is from an older release (or its fixed cells were edited): "
             f"make update MODULE={m}" for m in modules]
    return ("These notebooks of yours differ from the current release; `make update` carries "
            "your answers into the new release and keeps your file as a backup:\n"
            + "\n".join(lines))


@dataclass
class Update:
    """What `update` did to one module's notebook."""

    module: str
    backup: Path
    carried: list[str] = field(default_factory=list)  # answer grade ids filled from the old copy
    dropped: list[str] = field(default_factory=list)  # old answers the new release has no cell for
    added: int = 0  # learner-made cells appended at the end


def _blank_outputs(cell: NotebookNode) -> NotebookNode:
    cell = nbformat.from_dict(dict(cell))
    if cell.cell_type == "code":
        cell.outputs, cell.execution_count = [], None
    return cell


def merge(old: NotebookNode, new: NotebookNode) -> tuple[NotebookNode, list[str], list[str], int]:
    """The new release with the old answers in it; (notebook, carried, dropped, added)."""
    answers = {str(grade_id(c)): c for c in old.cells if grade_id(c) and is_answer_cell(c)}
    merged = nbformat.from_dict(dict(new))
    merged.cells, carried = [], []
    for cell in new.cells:
        gid = str(grade_id(cell))
        cell = _blank_outputs(cell)
        if gid in answers and is_answer_cell(cell):
            cell.source = answers[gid].source
            carried.append(gid)
        merged.cells.append(cell)
    dropped = [g for g in answers if g not in carried]
    known = {c.source for c in new.cells} | {c.get("id") for c in new.cells}
    mine = [_blank_outputs(c) for c in old.cells if grade_id(c) is None and c.source.strip()
            and c.source not in known and c.get("id") not in known]
    if mine:
        merged.cells.append(nbformat.v4.new_markdown_cell(ADDED_NOTE))
        merged.cells.extend(mine)
    for i, cell in enumerate(merged.cells):  # ids must stay unique after the additions
        cell["id"] = cell.get("id") or f"carried-{i}"
    return merged, carried, dropped, len(mine)


def update(module: str, *, workspace: Path = WORKSPACE_DIR, course: Path = COURSE_DIR,
           now: dt.datetime | None = None) -> Update:
    """Carry the answers of workspace/<module> into the current release (see the docstring)."""
    if module not in list_modules(course):
        raise ValueError(f"no released module {module!r} in {course}; released: "
                         f"{', '.join(list_modules(course))}")
    mine = workspace / module / f"{module}.ipynb"
    if not mine.exists():
        raise FileNotFoundError(f"{mine} does not exist: `make lab` makes your copy; there is "
                                "nothing to update")
    old = nbformat.read(mine, as_version=4)
    new = nbformat.read(course / module / f"{module}.ipynb", as_version=4)
    merged, carried, dropped, added = merge(old, new)
    stamp = (now or dt.datetime.now()).strftime("%Y%m%d-%H%M%S")
    backup = mine.with_name(f"{module}.before-update-{stamp}.ipynb")
    shutil.copy2(mine, backup)
    for extra in (course / module).iterdir():  # data files a new release brings
        target = workspace / module / extra.name
        if extra.is_file() and extra.suffix != ".ipynb" and not target.exists():
            shutil.copy2(extra, target)
    nbformat.write(merged, mine)
    return Update(module, backup, carried, dropped, added)
