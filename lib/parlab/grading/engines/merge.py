"""The single writer of a parallel autograde: merge workers' gradebooks, read results back.

`merge(worker_root, root)` copies, for every submission a worker graded, the submission's
timestamp, each cell's auto_score and auto_comment, and each notebook's late penalty into
`root`'s gradebook (creating the student and submission rows when new, never a second row),
the way nbgrader's SaveAutoGrades would have; manual scores already in the main gradebook
are kept. It then moves the worker's autograded notebooks into `root`/autograded/.
"""

from __future__ import annotations

import re
import shutil
import warnings
from pathlib import Path

import nbformat
from nbgrader.api import Gradebook, MissingEntry

from parlab.grading.base.cells import grade_id, is_graded_cell
from parlab.grading.engines.results import Graded
from parlab.grading.verify.apply import disagreement

_LIKELY = re.compile(r"Likely mistake:\s*(.+)")
_FINAL_ERROR = re.compile(r"^([A-Za-z_][\w.]*(Error|Exception|Exit)):? ?(.*)$")


def _db(root: Path) -> str:
    return f"sqlite:///{Path(root) / 'gradebook.db'}"


def merge(worker_root: Path, root: Path) -> list[tuple[str, str]]:
    """Copy the worker's submissions into root's gradebook and autograded/; what was merged."""
    merged = []
    with warnings.catch_warnings(), Gradebook(_db(worker_root)) as wgb, \
            Gradebook(_db(root)) as gb:
        # nbgrader's add_submission builds rows in a way SQLAlchemy warns about (harmless)
        warnings.filterwarnings("ignore", message=".*not in session.*")
        for student_dir in sorted((Path(worker_root) / "submitted").iterdir()):
            for module_dir in sorted(student_dir.iterdir()):
                student, module = student_dir.name, module_dir.name
                try:
                    src = wgb.find_submission(module, student)
                except MissingEntry:  # nbgrader stopped before recording it: nothing to copy
                    continue
                gb.update_or_create_student(student)
                gb.update_or_create_submission(module, student, timestamp=src.timestamp)
                for wnb in src.notebooks:
                    nb = gb.find_submission_notebook(wnb.name, module, student)
                    nb.late_submission_penalty = wnb.late_submission_penalty
                    for grade in wnb.grades:
                        mine = gb.find_grade(grade.name, wnb.name, module, student)
                        mine.auto_score = grade.auto_score
                        mine.needs_manual_grade = (mine.manual_score is not None
                                                   or mine.auto_score is None)
                    for comment in wnb.comments:
                        gb.find_comment(comment.name, wnb.name, module, student) \
                            .auto_comment = comment.auto_comment
                gb.db.commit()
                _move(Path(worker_root) / "autograded" / student / module,
                      Path(root) / "autograded" / student / module)
                merged.append((module, student))
    return merged


def _move(src: Path, dst: Path) -> None:
    if dst.exists():
        shutil.rmtree(dst)
    if src.exists():
        dst.parent.mkdir(parents=True, exist_ok=True)
        shutil.move(str(src), str(dst))


def _why_dropped(logs: list[str], module: str, student: str) -> str:
    """The last error line nbgrader logged after failing this submission."""
    needle = f"{student}/{module}"
    for log in logs:
        lines = log.splitlines()
        for i, line in enumerate(lines):
            if "error processing assignment" in line and needle in line:
                tail = [ln.strip() for ln in lines[i + 1: i + 60] if _FINAL_ERROR.match(ln.strip())]
                return tail[-1][:300] if tail else line.strip()[:300]
    return "nbgrader left no autograded notebook (see autograded/.parlab/worker*.log)"


def read_results(root: Path, pairs: list[tuple[str, str]], logs: list[str]) -> list[Graded]:
    """A `Graded` per (module, student): gradebook scores plus each test's message."""
    results = []
    with Gradebook(_db(root)) as gb:
        for module, student in pairs:
            maximum = float(gb.find_assignment(module).max_score)
            try:
                sub = gb.find_submission(module, student)
            except MissingEntry:
                results.append(Graded(module, student, None, maximum, "no gradebook row"))
                continue
            folder = Path(root) / "autograded" / student / module
            paths = [folder / f"{nb.name}.ipynb" for nb in sub.notebooks]
            if not all(p.exists() for p in paths):
                results.append(Graded(module, student, None, maximum,
                                      "not graded: " + _why_dropped(logs, module, student)))
                continue
            scores = {g.name: g.score for nb in sub.notebooks for g in nb.grades}
            graded = Graded(module, student, float(sub.score), maximum, "graded", 0.0)
            for path in paths:
                nb = nbformat.read(str(path), as_version=4)
                meta = nb.metadata.get("parlab", {})
                if meta.get("unreadable"):
                    graded.status = "graded (unreadable notebook)"
                graded.seconds += meta.get("grading", {}).get("seconds", 0.0)
                graded.restarts += meta.get("grading", {}).get("restarts", 0)
                for gid, seen in meta.get("verifier", {}).items():
                    if seen["verifier"] == "not verified":
                        graded.unverified[gid] = seen.get("message", "")
                    elif seen["verifier"] in ("passed", "failed") and \
                            seen["verifier"] != seen["notebook"]:
                        graded.disagreements[gid] = disagreement(seen["notebook"],
                                                                 seen["verifier"])
                for cell in nb.cells:
                    if cell.cell_type == "code" and is_graded_cell(cell):
                        gid = str(grade_id(cell))
                        graded.cells[gid] = (scores.get(gid), _message(cell))
                        if diagnosis := _diagnosis(cell):
                            graded.diagnoses[gid] = diagnosis
            results.append(graded)
    return results


def missing_results(root: Path, missing: dict[tuple[str, str], str]) -> list[Graded]:
    """A `Graded` without a score for each (module, student) whose notebook is missing."""
    if not missing:
        return []
    with Gradebook(_db(root)) as gb:
        return [Graded(m, s, None, float(gb.find_assignment(m).max_score), why)
                for (m, s), why in sorted(missing.items())]


def _diagnosis(cell) -> str | None:
    """The "Likely mistake: ..." line of a check's message in the cell's error, if any."""
    for output in cell.get("outputs", []):
        if output.get("output_type") == "error":
            if found := _LIKELY.search(output.get("evalue") or ""):
                return found.group(1).strip()[:200]
    return None


def _message(cell) -> str:
    """What a learner reads for a test cell: its last error, 'ename: first line'."""
    errors = [o for o in cell.get("outputs", []) if o.get("output_type") == "error"]
    if not errors:
        return ""
    first = (errors[-1].get("evalue") or "").strip().splitlines()
    return f"{errors[-1].get('ename')}: {first[0] if first else ''}".strip()
