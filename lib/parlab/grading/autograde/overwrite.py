"""nbgrader's OverwriteCells, marking the locked test cells it had to put back.

A locked test cell the learner edited is restored from the gradebook (nbgrader) and marked
'edited', with one warning in the log; nbgrader's own warning that the checksum changed, which
it logs for every locked cell with hidden tests even when untouched (the release lacks them),
is dropped, so that a real edit stands out. A test cell the learner deleted is put back
(add_missing_cells) and marked 'deleted', which parlab.grading.autograde.execute.ResilientExecute
scores 0 with a message instead of running it.
"""

from __future__ import annotations

from nbgrader import utils
from nbgrader.preprocessors import OverwriteCells
from traitlets import default

from parlab.grading.base.cells import META, grade_id, released_source


class ParlabOverwriteCells(OverwriteCells):
    """nbgrader's OverwriteCells that also marks the test cells it had to put back.

    A locked test cell the learner edited is restored (nbgrader) and marked 'edited'; a
    deleted test cell is re-added (add_missing_cells) and marked 'deleted', which
    ResilientExecute scores 0 with a message instead of running it.
    """

    missing_cell_notification = "This test cell was missing from the submission and was put " \
        "back by the grader.\n\n"

    @default("add_missing_cells")
    def _add_missing_cells_default(self) -> bool:
        return True

    def report_change(self, name: str, attr: str, old: object, new: object) -> None:
        """nbgrader warns that the checksum of every locked cell with hidden tests changed
        (the release lacks them); whether the learner really edited it is decided in
        preprocess_cell, which warns only then."""
        if attr == "checksum":
            self._checksum_changed = True
            return
        super().report_change(name, attr, old, new)

    def preprocess_cell(self, cell, resources, cell_index):
        before, self._checksum_changed = cell.source, False
        cell, resources = super().preprocess_cell(cell, resources, cell_index)
        # The gradebook's source holds the hidden tests that the release lacks: the learner
        # edited the cell if it differs from the source without them.
        if self._checksum_changed and before != released_source(cell):
            student = resources.get("nbgrader", {}).get("student", "?")
            self.log.warning("EDITED LOCKED CELL: %s's %s was changed by the learner; it was "
                             "restored and runs as released", student, grade_id(cell))
            if utils.is_grade(cell):
                cell.metadata.setdefault(META, {})["restored"] = "edited"
        return cell, resources

    def missing_cell_transform(self, source_cell, max_score, is_solution=False, is_task=False):
        cell = super().missing_cell_transform(source_cell, max_score, is_solution, is_task)
        if not is_solution and not is_task and cell.cell_type == "code":
            cell.source = source_cell.source  # put back exactly what was released
            cell.metadata[META] = {"restored": "deleted"}
        return cell
