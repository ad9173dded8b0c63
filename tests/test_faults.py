"""The fault corpus: every broken submission is graded, readably, in bounded time, alone.

autograder/faults/ holds one entry per way a learner's notebook can go wrong (see
autograder/README.md); tests/grading_runs.py submits each as a student of the faultlab module
beside alice (full answers) and bob (blank), and grades them all through the real nbgrader
autograde path, three workers in parallel, with the instructor's limits FAULT_ARGS. For each
entry: the tests it names score 0 with a message containing the expected words, every other
test keeps its full points (graded even after a dead or hung kernel), and its notebook was
graded within its bound. For the run: no process is left behind (counted by the run's
environment token), alice and bob keep their scores, and the gradebook has exactly one row
per student.
"""

from __future__ import annotations

from collections import Counter

import nbformat
import pytest
from grading_runs import (
    BLANK,
    FAULT_MODULE,
    FAULTS_DIR,
    FULL,
    SUBMISSION_TIMEOUT_S,
    WORKERS,
    load_faults,
)

from parlab.grading import has_error, leftover_processes

pytestmark = pytest.mark.slow

FAULTS = load_faults()
# The run's bound, set by the "instructor": every notebook's limit, spread over the workers,
# plus the start-up of each worker (nbgrader and a gradebook copy).
RUN_BOUND_S = SUBMISSION_TIMEOUT_S * 2 + 120
# What the issue asks the corpus to cover, by entry name (an entry may not silently vanish).
REQUIRED = {"deadlock", "mismatched_collectives", "rank_raises", "shape_mismatch",
            "infinite_loop", "ignores_sigint", "os_exit", "huge_allocation",
            "edited_test_cell", "deleted_test_cell", "invalid_json", "os_exit_in_answer",
            "missing_return"}


def test_corpus_covers_every_required_fault() -> None:
    names = {f.name for f in FAULTS}
    assert not REQUIRED - names, f"autograder/faults/ lacks entries: {sorted(REQUIRED - names)}"
    for fault in FAULTS:
        assert fault.doc and fault.expect, f"{fault.name}: needs a docstring and EXPECT"


@pytest.mark.parametrize("fault", FAULTS, ids=[f.name for f in FAULTS])
def test_fault_is_graded_as_expected(fault_run, fault) -> None:
    graded = fault_run.run.get(FAULT_MODULE, fault.student)
    where = f"fault {fault.name} (student {fault.student})"
    assert graded.score is not None, f"{where}: not graded at all: {graded.status}"
    maximum = {gid: float(c.metadata["nbgrader"]["points"]) for gid, c in _test_cells(
        nbformat.read(str(FAULTS_DIR / FAULT_MODULE / f"{FAULT_MODULE}.ipynb"), 4)).items()}
    assert set(graded.cells) == set(maximum), (
        f"{where}: test cells {sorted(graded.cells)}, expected {sorted(maximum)}")
    for gid, (score, message) in graded.cells.items():
        if gid in fault.expect:
            ename, words = fault.expect[gid]
            assert score == 0, f"{where}: {gid} scored {score}, expected 0 ({message})"
            assert message.startswith(f"{ename}:") and words in message, (
                f"{where}: {gid} says {message!r}; expected {ename} mentioning {words!r}")
        else:
            assert score == maximum[gid], (
                f"{where}: {gid}, which the fault does not touch, scored {score} of "
                f"{maximum[gid]}: {message or 'no error'}")
    assert graded.seconds is not None and graded.seconds <= fault.max_seconds, (
        f"{where}: grading took {graded.seconds} s, bound {fault.max_seconds} s")
    if fault.note:
        cells = _test_cells(fault_run.autograded(fault.student, FAULT_MODULE))
        for gid, words in fault.note.items():
            printed = "".join(o.get("text", "") for o in cells[gid].outputs
                              if o.get("output_type") == "stream")
            assert words in printed, f"{where}: {gid} lacks the note {words!r}: {printed!r}"


def test_only_real_edits_of_locked_cells_are_warned_about(fault_run) -> None:
    """nbgrader warns that the checksum changed for every untouched hidden-test cell; those
    warnings are gone, and the one real edit (the edited_test_cell entry) stands out, in the
    workers' logs and in what `autograde` prints."""
    lines = [ln for log in fault_run.run.logs for ln in log.splitlines()]
    assert not [ln for ln in lines if "Attribute 'checksum'" in ln], (
        "nbgrader's checksum warning for untouched hidden-test cells is still logged")
    edited = [ln for ln in lines if "EDITED LOCKED CELL" in ln]
    assert len(edited) == 1 and "fault-edited-test-cell's double_test" in edited[0], edited
    assert "EDITED LOCKED CELL: fault-edited-test-cell's double_test" in (
        fault_run.steps["autograde"].stdout)


def test_no_process_is_left_behind(fault_run) -> None:
    run = fault_run.run
    assert run.leftover == [], (
        f"{len(run.leftover)} processes of the run (kernels or ranks) outlived their worker: "
        f"{run.leftover}")
    # ... and none appeared since: every process the run started carries its token
    assert run.token and leftover_processes(run.token) == []


def test_other_submissions_keep_their_scores(fault_run) -> None:
    full = fault_run.run.get(FAULT_MODULE, FULL)
    blank = fault_run.run.get(FAULT_MODULE, BLANK)
    assert full.score == full.max_score, (
        f"alice, graded beside the faults, scores {full.score} of {full.max_score}: {full.cells}")
    assert blank.score == 0, f"bob (blank) scores {blank.score}: {blank.cells}"
    assert not any(has_error(c) for c in fault_run.autograded(FULL, FAULT_MODULE).cells
                   if c.cell_type == "code"), "alice's notebook has a cell with an error"


def test_gradebook_has_one_row_per_submission(fault_run) -> None:
    from nbgrader.api import Gradebook

    students = fault_run.students[FAULT_MODULE]
    assert len(students) >= 2 * WORKERS, "fewer submissions than needed to prove the merge"
    with Gradebook(f"sqlite:///{fault_run.root / 'gradebook.db'}") as gb:
        rows = Counter(s.student.id for s in gb.assignment_submissions(FAULT_MODULE))
        grades = {s.student.id: sum(len(nb.grades) for nb in s.notebooks)
                  for s in gb.assignment_submissions(FAULT_MODULE)}
        cells = len(gb.find_notebook(FAULT_MODULE, FAULT_MODULE).grade_cells)
    assert rows == dict.fromkeys(students, 1), f"submission rows per student: {dict(rows)}"
    assert set(grades.values()) == {cells}, f"grade rows per submission: {grades}"
    assert len(fault_run.run.results) == len(students)


def test_run_ends_within_its_bound(fault_run) -> None:
    run = fault_run.run
    assert run.workers == WORKERS
    assert run.seconds <= RUN_BOUND_S, (
        f"grading {len(run.results)} submissions took {run.seconds:.0f} s (bound {RUN_BOUND_S} s)")


def _test_cells(nb) -> dict:
    return {c.metadata["nbgrader"]["grade_id"]: c for c in nb.cells
            if c.cell_type == "code" and c.metadata.get("nbgrader", {}).get("grade")}

