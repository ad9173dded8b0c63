"""No feedback file shows what the release hides (parlab.grading.feedback.leakcheck).

A small course (one module "m": a code answer, a written answer, a test with a hidden part)
is laid out in a temporary root, with autograded notebooks built with nbformat (no kernel):
- alice answered right: her feedback shows her own answer, which equals the solution;
- bob left the answer blank, and his test's traceback quotes the solution's line;
- carol left it blank, and her traceback quotes a hidden test (HideHiddenTests removes it);
- erin's folder holds a file beside the notebook that quotes the written solution;
- frank's notebook was unreadable: his own raw text, with his right answer, is beside it.
nbgrader's GenerateFeedback runs in this process with our exporter, as the formgrader's
"Generate Feedback" runs it (nbgrader.utils.capture_log), and under `write_feedback`.
Then each course module's feedback, for the full answers and for the blank release, is shown
not to be withheld (no solution line is secret from its author, none from the release text).
"""

from __future__ import annotations

import copy
import io
from pathlib import Path

import nbformat
import pytest
from nbgrader.converters import GenerateFeedback
from nbgrader.coursedir import CourseDirectory
from nbgrader.preprocessors import NbGraderPreprocessor
from nbgrader.utils import capture_log
from traitlets.config import Config
from traitlets.config.loader import PyFileConfigLoader

from parlab.grading.base.cells import grade_id, is_answer_cell
from parlab.grading.base.paths import (
    AUTOGRADER_DIR,
    COURSE_DIR,
    REPO_ROOT,
    SOLUTIONS_DIR,
    list_modules,
)
from parlab.grading.base.runner import NbgraderError, NbgraderRun
from parlab.grading.collect.fake import fake_submission
from parlab.grading.feedback import hidden as feedback
from parlab.grading.feedback import withhold
from parlab.grading.feedback.hidden import PLACEHOLDER, HideHiddenTests
from parlab.grading.feedback.leakcheck import (
    FeedbackGuard,
    FeedbackWithheld,
    scan_feedback,
    secret_lines,
    solution_only_lines,
    withheld_in_log,
)

ANSWER = "return x * 41 + 1"
WRITTEN = "The ring moves 2(p-1)/p of the data per rank."
HIDDEN = "assert f(2) == 83, 'secret'"
RELEASED = [m for m in list_modules(COURSE_DIR) if (SOLUTIONS_DIR / m).is_dir()]


def _cell(kind: str, source: str, gid: str, **flags) -> nbformat.NotebookNode:
    meta = {"grade": False, "solution": False, "locked": False, "schema_version": 3,
            "grade_id": gid, **flags}
    if meta["grade"]:
        meta["points"] = 1
    make = nbformat.v4.new_code_cell if kind == "code" else nbformat.v4.new_markdown_cell
    return make(source, metadata={"nbgrader": meta})


def _notebook(answer: str, written: str, test: str) -> nbformat.NotebookNode:
    return nbformat.v4.new_notebook(cells=[
        nbformat.v4.new_markdown_cell("Write f so that `f(1) == 42`."),
        _cell("code", answer, "f_answer", solution=True),
        _cell("markdown", written, "why", solution=True, grade=True),
        _cell("code", test, "f_test", grade=True, locked=True),
    ])


TEST = f"assert f(1) == 42\n### BEGIN HIDDEN TESTS\n{HIDDEN}\n### END HIDDEN TESTS"
SOURCE = _notebook(f"def f(x):\n    ### BEGIN SOLUTION\n    {ANSWER}\n    ### END SOLUTION",
                   WRITTEN, TEST)
STUB = "def f(x):\n    # YOUR CODE HERE\n    raise NotImplementedError()"
RELEASE = _notebook(STUB, "YOUR ANSWER HERE", "assert f(1) == 42")


def _graded(answer: str, quoted: str = "") -> nbformat.NotebookNode:
    """An autograded notebook: the learner's answer, the test restored with its hidden part,
    and (if `quoted`) a traceback in the test cell that quotes that line."""
    nb = _notebook(answer, "It sends everything twice.", TEST)
    if quoted:
        nb.cells[3].outputs = [nbformat.v4.new_output(
            "error", ename="AssertionError", evalue="",
            traceback=["Traceback (most recent call last):", f"---> 12 {quoted}",
                       "AssertionError"])]
    return nb


STUDENTS = {
    "alice": _graded(f"def f(x):\n    {ANSWER}  # mine"),
    "bob": _graded(STUB, quoted=ANSWER),
    "carol": _graded(STUB, quoted=HIDDEN),
    "erin": _graded(STUB),
}


@pytest.fixture
def course(tmp_path: Path) -> Path:
    for folder, nb in [("solutions/m", SOURCE), ("course/m", RELEASE),
                       *((f"autograded/{s}/m", nb) for s, nb in STUDENTS.items())]:
        (tmp_path / folder).mkdir(parents=True)
        nbformat.write(nb, str(tmp_path / folder / "m.ipynb"))
    (tmp_path / "autograded/erin/m/notes.txt").write_text(f"model answer: {WRITTEN}\n")
    # frank handed in a notebook nbgrader could not read: graded as the release, his raw
    # text kept beside it (parlab.grading.engines.share) and so copied into his feedback folder
    raw = nbformat.writes(_graded(f"def f(x):\n    {ANSWER}"))[:-40]
    for folder in ("submitted/frank/m", "autograded/frank/m"):
        (tmp_path / folder).mkdir(parents=True, exist_ok=True)
        (tmp_path / folder / "m.ipynb.unreadable").write_text(raw)
    nbformat.write(RELEASE, str(tmp_path / "autograded/frank/m/m.ipynb"))
    return tmp_path


class Grades(NbGraderPreprocessor):
    """What nbgrader's GetGrades puts in, for the feedback template, without a gradebook."""

    def preprocess(self, nb, resources):
        resources["nbgrader"].update(score=0.0, max_score=2.0, late_penalty=0.0)
        for cell in nb.cells:
            meta = cell.metadata.get("nbgrader", {})
            if meta.get("solution") or meta.get("grade"):
                meta.update(score=0.0, points=1.0, comment="")
        return nb, resources


def _generate(root: Path) -> dict:
    """GenerateFeedback in this process, as the formgrader's button runs it (with `Grades`
    for nbgrader's GetGrades, which needs a gradebook), with the course's exporter."""
    c = Config()
    c.CourseDirectory.root = str(root)
    c.CourseDirectory.source_directory = "solutions"
    c.CourseDirectory.release_directory = "course"
    c.CourseDirectory.assignment_id = "m"
    c.GenerateFeedback.preprocessors = [Grades, HideHiddenTests]
    c.GenerateFeedback.exporter_class = FeedbackGuard
    app = GenerateFeedback(coursedir=CourseDirectory(config=c), config=c)
    app.force = True
    return capture_log(app)


# --- the rule ---------------------------------------------------------------------------------
def test_solution_only_lines_are_the_answers_the_release_does_not_show() -> None:
    lines = solution_only_lines(SOURCE, RELEASE)
    assert lines == {ANSWER, WRITTEN}  # not "def f(x):", which the release shows
    generic = copy.deepcopy(RELEASE)
    generic.cells[0].source += f"\n\n`{ANSWER}`"
    assert solution_only_lines(SOURCE, generic) == {WRITTEN}


def test_a_solution_line_is_secret_unless_the_student_wrote_it() -> None:
    assert secret_lines(STUDENTS["alice"], SOURCE, RELEASE) == {
        WRITTEN: "solution", HIDDEN: "hidden-test"}
    assert secret_lines(STUDENTS["bob"], SOURCE, RELEASE) == {
        ANSWER: "solution", WRITTEN: "solution", HIDDEN: "hidden-test"}


# --- the formgrader's path: nbgrader's converter in this process ------------------------------
def test_generate_feedback_writes_no_file_with_a_leak(course: Path) -> None:
    result = _generate(course)
    log = result.get("log", "") + result.get("error", "")
    assert not result["success"], "a leaking file was written without an error"
    page = (course / "feedback/alice/m/m.html").read_text()  # her own right answer
    assert ANSWER in feedback.html_text(page)
    carol = (course / "feedback/carol/m/m.html").read_text()  # hidden tests as before
    assert PLACEHOLDER in carol and HIDDEN not in feedback.html_text(carol)
    assert not (course / "feedback/bob/m").exists()
    assert not (course / "feedback/erin/m").exists()
    assert ANSWER in (course / "feedback/frank/m/m.ipynb.unreadable").read_text()
    found = {(w.student, w.module, w.kind, w.line) for w in withheld_in_log(log)}
    assert found == {("bob", "m", "solution", ANSWER), ("erin", "m", "solution", WRITTEN)}, log
    assert "WITHHELD feedback of student 'bob', module 'm'" in log


def test_guard_refuses_a_page_that_shows_a_hidden_test(course: Path) -> None:
    """Hidden-test lines always leak: without HideHiddenTests, the page quotes the hidden
    region, and the exporter refuses it."""
    cd = CourseDirectory(root=str(course), source_directory="solutions",
                         release_directory="course")
    guard = FeedbackGuard(coursedir=cd)
    resources = {"nbgrader": {"student": "alice", "assignment": "m", "notebook": "m"}}
    with pytest.raises(FeedbackWithheld, match=r"student 'alice', module 'm'.*hidden-test"):
        guard.from_notebook_node(STUDENTS["alice"], copy.deepcopy(resources))
    guard.register_preprocessor(HideHiddenTests)
    page, _ = guard.from_notebook_node(STUDENTS["alice"], copy.deepcopy(resources))
    assert ANSWER in feedback.html_text(page)


def test_guard_withholds_when_the_source_is_missing(course: Path) -> None:
    (course / "solutions/m/m.ipynb").unlink()
    guard = FeedbackGuard(coursedir=CourseDirectory(root=str(course)))
    with pytest.raises(FeedbackWithheld, match="unchecked"):
        guard.from_notebook_node(STUDENTS["alice"], {"nbgrader": {
            "student": "alice", "assignment": "m", "notebook": "m"}})


def test_the_course_config_uses_the_guard() -> None:
    cfg = PyFileConfigLoader("nbgrader_config.py", path=str(AUTOGRADER_DIR)).load_config()
    assert cfg.GenerateFeedback.exporter_class is FeedbackGuard
    assert HideHiddenTests in cfg.GenerateFeedback.preprocessors


# --- the `feedback` command -------------------------------------------------------------------
def test_write_feedback_reports_and_withholds(course: Path, monkeypatch) -> None:
    def nbgrader(*args: str, root: Path, check: bool = True) -> NbgraderRun:
        result = _generate(root)
        # a file the guard never saw (an older run, a hand copy): the scan must find it
        (root / "feedback/alice/m/notes.txt").write_text(f"{WRITTEN}\n")
        return NbgraderRun(args, 0 if result["success"] else 1, 0.1,
                           result.get("log", "") + result.get("error", ""))

    monkeypatch.setattr(withhold, "run_nbgrader", nbgrader)
    out = io.StringIO()
    withheld = withhold.write_feedback(course, "m", out=out)
    assert sorted(p.parent.parent.name for p, _ in withheld) == ["alice", "bob", "erin"]
    lines = out.getvalue().splitlines()
    assert len(lines) == 3 and all(ln.startswith("WITHHELD feedback of student") for ln in lines)
    assert any("'bob', module 'm'" in ln and ANSWER in ln for ln in lines), lines
    assert not (course / "feedback/alice/m/notes.txt").exists()
    assert (course / "feedback/alice/m/m.html").exists()
    assert (course / "feedback/carol/m/m.html").exists()


def test_write_feedback_still_fails_on_another_nbgrader_error(course: Path, monkeypatch) -> None:
    monkeypatch.setattr(withhold, "run_nbgrader", lambda *a, root, check=True: NbgraderRun(
        a, 1, 0.1, "There was an error processing assignment 'm' for student 'bob'"))
    with pytest.raises(NbgraderError):
        withhold.write_feedback(course, "m", out=io.StringIO())


def test_scan_deletes_a_page_written_without_the_guard(course: Path) -> None:
    folder = course / "feedback/bob/m"
    folder.mkdir(parents=True)
    (folder / "m.html").write_text(f"<pre><span>{ANSWER[:6]}</span>{ANSWER[6:]}</pre>")
    (course / "feedback/alice/m").mkdir(parents=True)
    (course / "feedback/alice/m/m.html").write_text(f"<pre>{ANSWER}</pre>")
    found = scan_feedback(course, "m")
    assert [(w.student, w.kind, w.line) for w in found] == [("bob", "solution", ANSWER)]
    assert not (folder / "m.html").exists()
    assert (course / "feedback/alice/m/m.html").exists()


# --- the course's own modules: a right answer or the release itself is never withheld ---------
@pytest.mark.slow  # about 1 s a module: two pages rendered
@pytest.mark.parametrize("module", RELEASED or [pytest.param(None, marks=pytest.mark.skip(
    reason="course/ is empty"))])
def test_course_feedback_of_full_and_blank_answers_is_not_withheld(module: str,
                                                                  tmp_path: Path) -> None:
    name = f"{module}.ipynb"
    source = nbformat.read(str(SOLUTIONS_DIR / module / name), as_version=4)
    release = nbformat.read(str(COURSE_DIR / module / name), as_version=4)
    guard = FeedbackGuard(config=GenerateFeedback(config=Config()).config,
                          coursedir=CourseDirectory(
                              root=str(REPO_ROOT), source_directory="solutions",
                              release_directory="course", feedback_directory=str(tmp_path)))
    for pp in (Grades, HideHiddenTests):
        guard.register_preprocessor(pp)
    tests = {grade_id(c): c.source for c in source.cells if grade_id(c) and not is_answer_cell(c)}
    for student, nb in [("full", fake_submission(source, release)), ("blank", release)]:
        graded = copy.deepcopy(nb)  # as autograded: locked cells as in the source
        for cell in graded.cells:
            cell.source = tests.get(grade_id(cell), cell.source)
        assert any(k == "solution" for k in secret_lines(graded, source, release).values()) \
            == (student == "blank")
        guard.from_notebook_node(graded, {"nbgrader": {  # raises FeedbackWithheld on a leak
            "student": student, "assignment": module, "notebook": module}})
