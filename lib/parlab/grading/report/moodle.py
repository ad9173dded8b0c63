"""Moodle's grade import: `make export FORMAT=moodle` writes grades-moodle.csv.

    nbgrader export --exporter=parlab.grading.report.moodle.MoodleExport --to grades-moodle.csv

The CSV Moodle's Grades > Import > CSV file reads (MoodleDocs, "Grade import",
https://docs.moodle.org/en/Grade_import; its parser, moodle's
grade/import/csv/classes/load_data.php): the first row names the columns; on the preview page
the teacher maps one column to a user field ("Map from" that column, "Map to" `username`,
`useremail`, `useridnumber` or `userid`) and every other column to a grade item (an existing
one, or a new one named by the header) or to nothing. A row whose user Moodle cannot find
stops the whole import, so every row here has a username (and an email, when the class list
gave one); a grade is a number (a dot for decimals) or `-` (no grade); a new grade item's
maximum is Moodle's gradepointmax, 100 unless the site raised it, and a grade above it stops
the import (the exporter says so when a module has more points).

Columns: `Username` (the student id, which `make hub-roster` took from Moodle's username
column: map it to username), `Email address` (or map this one to useremail), `First name`,
`Last name` (map them to nothing), then one column per module.

The table (who, which modules, the late penalty) is parlab.grading.report.platform's.
"""

from __future__ import annotations

import csv
from pathlib import Path

from parlab.grading.report.platform import Grades, PlatformExport, cell

__all__ = ["MoodleExport", "STUDENT_COLUMNS", "GRADEPOINTMAX"]

STUDENT_COLUMNS = ["Username", "Email address", "First name", "Last name"]
GRADEPOINTMAX = 100.0     # Moodle's default largest grade (Site administration > Grades)


class MoodleExport(PlatformExport):
    """grades-moodle.csv for Moodle's CSV grade import (the module doc)."""

    default_to = "grades-moodle.csv"

    def write(self, path: Path, grades: Grades) -> None:
        with open(path, "w", newline="", encoding="utf-8") as f:
            writer = csv.writer(f)
            writer.writerow([*STUDENT_COLUMNS, *(m.name for m in grades.modules)])
            for row in grades.students:
                writer.writerow([row.id, row.email, row.first_name, row.last_name,
                                 *(cell(s, "-") for s in row.scores)])
        no_email = [r.id for r in grades.students if not r.email]
        if no_email:
            self.log.warning("no email for %s: map Moodle's user from Username, not from "
                             "Email address (Moodle stops an import at a row it cannot match)",
                             ", ".join(no_email))
        over = [m.name for m in grades.modules if m.points > GRADEPOINTMAX]
        if over:
            self.log.warning("%s have more than %g points, Moodle's default largest grade: "
                             "raise gradepointmax or map them to grade items with that maximum",
                             ", ".join(over), GRADEPOINTMAX)
