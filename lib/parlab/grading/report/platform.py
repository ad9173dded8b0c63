"""Grades for a learning platform's gradebook: what the Canvas and Moodle exporters share.

    make export FORMAT=canvas      # grades-canvas.csv (parlab.grading.report.canvas)
    make export FORMAT=moodle      # grades-moodle.csv (parlab.grading.report.moodle)
    nbgrader export --exporter=parlab.grading.report.canvas.CanvasExport --to grades-canvas.csv

Both are nbgrader export plugins (`nbgrader.plugins.ExportPlugin`): nbgrader opens the
gradebook of the course root and calls `export(gradebook)`. They write the same table in each
platform's own form:

- one row per student of the class: the gradebook's students, less those `make hub-roster`
  retired (roster.json: the platform has dropped them, and Moodle stops a whole import at a
  user it does not know); their grades stay in the gradebook and grades.csv;
- one column per module the gradebook has graded (its points known: nbgrader counts a
  module's points when it first autogrades it), in nbgrader's order (due date, then name);
- each cell the score less nbgrader's late penalty (the `score` of grades.csv, at least 0):
  a student who handed nothing in scores 0; a submission collected but not autograded yet is
  left without a grade (and named in the log: run `make autograde` first).

The student's identifiers come from the gradebook (the id, names, email and the platform's own
id as `lms_user_id`, all put there by `make hub-roster`) and roster.json (Canvas's SIS User
ID and section). `--ClassName.student` and `--ClassName.assignment` narrow the export as for
nbgrader's own CSV exporter.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from nbgrader.api import Gradebook, MissingEntry
from nbgrader.plugins import ExportPlugin

from parlab.hub.roster import Roster

__all__ = ["PlatformExport", "Grades", "StudentRow", "ModuleColumn", "cell"]


@dataclass(frozen=True)
class ModuleColumn:
    name: str
    points: float


@dataclass(frozen=True)
class StudentRow:
    id: str
    first_name: str
    last_name: str
    email: str
    lms_user_id: str
    sis_user_id: str
    section: str
    scores: tuple[float | None, ...]      # one per module; None: not graded yet


@dataclass(frozen=True)
class Grades:
    modules: list[ModuleColumn]
    students: list[StudentRow]
    retired: list[str]
    not_graded: list[tuple[str, str]]     # (student, module) collected, not autograded


def cell(score: float | None, missing: str) -> str:
    """A score as both platforms read it (a dot, at most two decimals), or `missing`."""
    return missing if score is None else f"{round(score, 2):g}"


class PlatformExport(ExportPlugin):
    """The shared table; a subclass writes it (`write`) and names its default file."""

    default_to = "grades-platform.csv"

    def course_root(self) -> Path:
        coursedir = getattr(self.parent, "coursedir", None)
        return Path(coursedir.root if coursedir is not None else ".").resolve()

    def grades(self, gradebook: Gradebook) -> Grades:
        root = self.course_root()
        roster = Roster.load(root)
        wanted_modules = {str(a) for a in self.assignment}
        wanted_students = {str(s) for s in self.student}
        modules = [a for a in gradebook.assignments if a.max_score
                   and (not wanted_modules or a.name in wanted_modules)]
        retired = set(roster.retired())
        rows, not_graded = [], []
        for student in sorted(gradebook.students, key=lambda s: s.id):
            if student.id in retired or (wanted_students and student.id not in wanted_students):
                continue
            scores = []
            for module in modules:
                scores.append(self._score(root, gradebook, module.name, student.id))
                if scores[-1] is None:
                    not_graded.append((student.id, module.name))
            listed = roster.students.get(student.id)
            rows.append(StudentRow(
                student.id, student.first_name or "", student.last_name or "",
                student.email or "", student.lms_user_id or "",
                listed.sis_user_id if listed else "", listed.section if listed else "",
                tuple(scores)))
        return Grades([ModuleColumn(a.name, float(a.max_score)) for a in modules], rows,
                      sorted(retired & {s.id for s in gradebook.students}), not_graded)

    @staticmethod
    def _score(root: Path, gradebook: Gradebook, module: str, student: str) -> float | None:
        """The score less the late penalty; 0 when nothing was handed in; None when handed in
        and not graded (as grades.csv's statuses, parlab.grading.report.export)."""
        try:
            sub = gradebook.find_submission(module, student)
        except MissingEntry:
            handed_in = (root / "submitted" / student / module).is_dir()
            return None if handed_in else 0.0
        graded = root / "autograded" / student / module
        if not all((graded / f"{nb.name}.ipynb").exists() for nb in sub.notebooks):
            return None
        return max(0.0, sub.score - (sub.late_submission_penalty or 0.0))

    def write(self, path: Path, grades: Grades) -> None:
        raise NotImplementedError

    def export(self, gradebook: Gradebook) -> None:
        path = Path(self.to or self.default_to).resolve()
        grades = self.grades(gradebook)
        self.write(path, grades)
        self.log.info("%s: %d students, %d modules (%s), scores less the late penalty",
                      path, len(grades.students), len(grades.modules),
                      ", ".join(m.name for m in grades.modules) or "none graded yet")
        if grades.retired:
            self.log.info("left out %d students retired from the class list (their grades stay"
                          " in the gradebook): %s", len(grades.retired), ", ".join(grades.retired))
        if grades.not_graded:
            self.log.warning("collected but not autograded yet, so without a grade here (run "
                             "make autograde): %s",
                             ", ".join(f"{s}/{m}" for s, m in grades.not_graded))
