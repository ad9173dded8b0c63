"""Canvas's gradebook import: `make export FORMAT=canvas` writes grades-canvas.csv.

    nbgrader export --exporter=parlab.grading.report.canvas.CanvasExport --to grades-canvas.csv

The CSV Canvas's Grades > Import reads (Canvas Instructor Guide, "How do I import grades in the
Gradebook?", https://community.canvaslms.com/t5/Instructor-Guide/How-do-I-import-grades-in-the-Gradebook/ta-p/807;
its parser, canvas-lms app/models/gradebook_importer.rb):

- the header row: `Student`, `ID`, `SIS User ID`, `SIS Login ID`, `Section` (Canvas takes a
  row as the header only when its first column says Student and its second ID, and the last
  student column, here the fifth after SIS User ID and SIS Login ID, says Section), then one
  column per assignment, named by its title: a title no assignment of the course has makes a
  new assignment with it;
- a `Points Possible` row: each assignment's points (a new assignment gets them);
- one row per student, whom Canvas finds by ID (its own user id), else SIS User ID, else SIS
  Login ID, else the name (`Last, First` is Canvas's sortable name). Here ID is the
  gradebook's `lms_user_id` (the ID column of the class list, when it came from Canvas), SIS
  Login ID the student id (a Canvas login), SIS User ID and Section the class list's;
- a score (a dot for decimals), or empty: no grade.

The table (who, which modules, the late penalty) is parlab.grading.report.platform's.
"""

from __future__ import annotations

import csv
from pathlib import Path

from parlab.grading.report.platform import Grades, PlatformExport, StudentRow, cell

__all__ = ["CanvasExport", "STUDENT_COLUMNS"]

STUDENT_COLUMNS = ["Student", "ID", "SIS User ID", "SIS Login ID", "Section"]


def sortable_name(row: StudentRow) -> str:
    if row.first_name and row.last_name:
        return f"{row.last_name}, {row.first_name}"
    return row.last_name or row.first_name or row.id


class CanvasExport(PlatformExport):
    """grades-canvas.csv for Canvas's gradebook import (the module doc)."""

    default_to = "grades-canvas.csv"

    def write(self, path: Path, grades: Grades) -> None:
        with open(path, "w", newline="", encoding="utf-8") as f:
            writer = csv.writer(f)
            writer.writerow([*STUDENT_COLUMNS, *(m.name for m in grades.modules)])
            writer.writerow(["Points Possible", "", "", "", "",
                             *(cell(m.points, "") for m in grades.modules)])
            for row in grades.students:
                writer.writerow([sortable_name(row), row.lms_user_id, row.sis_user_id, row.id,
                                 row.section, *(cell(s, "") for s in row.scores)])
