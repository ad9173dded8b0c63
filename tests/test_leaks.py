"""No leaks: course/ holds no solution code and no hidden test, and its graded cells are sealed.

For every module released in course/, against its source in solutions/:
- no file in course/<module>/ holds a solution or hidden-test delimiter;
- no text file there holds a line of a solution region or of a hidden test that appears
  nowhere else in the source (whitespace collapsed; lines under 6 characters are ignored);
- every nbgrader cell that is graded, an answer, or locked carries the checksum nbgrader
  uses to detect tampering, and that checksum is nbgrader's own (`compute_checksum`) for the
  released cell, so an edited test cell is caught and restored at grading time.
The detectors are also run on a release made leaky on purpose, one fault at a time, so each
is known to fail when it should.
"""

from __future__ import annotations

import copy
import re
from pathlib import Path

import nbformat
import pytest
from nbgrader.utils import compute_checksum

from parlab.grading import COURSE_DIR, MIN_CHARS, SOLUTIONS_DIR, list_modules, normalise

DELIMITERS = re.compile(r"(BEGIN|END) (SOLUTION|HIDDEN TESTS)")
_REGION = {"solution": ("BEGIN SOLUTION", "END SOLUTION"),
           "hidden": ("BEGIN HIDDEN TESTS", "END HIDDEN TESTS")}


def region_lines(source_nb, kind: str) -> set[str]:
    """Lines of `kind` regions that appear nowhere outside such regions in the source."""
    begin, end = _REGION[kind]
    inside_lines, outside = set(), []
    for cell in source_nb.cells:
        inside = False
        for line in cell.source.split("\n"):
            if begin in line:
                inside = True
            elif end in line:
                inside = False
            elif inside:
                if len(norm := normalise(line)) >= MIN_CHARS:
                    inside_lines.add(norm)
            else:
                outside.append(normalise(line))
    visible = "\n".join(outside)
    return {line for line in inside_lines if line not in visible}


def _texts(folder: Path) -> dict[str, str]:
    """Readable text of every file in a release folder (notebooks: every cell and output)."""
    texts = {}
    for path in sorted(p for p in folder.rglob("*") if p.is_file()):
        try:
            text = path.read_text()
        except (UnicodeDecodeError, OSError):
            continue
        if path.suffix == ".ipynb":
            nb = nbformat.reads(text, as_version=4)
            text = "\n".join([c.source for c in nb.cells] + [str(c.get("outputs", ""))
                                                              for c in nb.cells])
        texts[str(path.relative_to(folder))] = "\n".join(normalise(ln) for ln in
                                                         text.split("\n"))
    return texts


def leaked(source_nb, texts: dict[str, str]) -> list[str]:
    """What of the source's solutions and hidden tests can be read in the release texts."""
    found = []
    for name, text in texts.items():
        if m := DELIMITERS.search(text):
            found.append(f"{name}: delimiter {m.group(0)!r}")
        for kind in ("solution", "hidden"):
            for line in region_lines(source_nb, kind):
                if line in text:
                    found.append(f"{name}: {kind} line {line!r}")
    return found


def unsealed(release_nb) -> list[str]:
    """nbgrader cells without their tamper checksum, or with one that is not nbgrader's."""
    bad = []
    for index, cell in enumerate(release_nb.cells):
        meta = cell.get("metadata", {}).get("nbgrader")
        if not meta or not (meta.get("grade") or meta.get("solution") or meta.get("locked")):
            continue
        label = f"cell {index} ({meta.get('grade_id')})"
        if "checksum" not in meta:
            bad.append(f"{label}: no checksum")
        elif meta["checksum"] != compute_checksum(cell):
            bad.append(f"{label}: checksum is not nbgrader's for this cell")
    return bad


RELEASED = [m for m in list_modules(COURSE_DIR) if (SOLUTIONS_DIR / m).is_dir()]
PARAMS = RELEASED or [pytest.param(None, marks=pytest.mark.skip(reason="course/ is empty"))]


def _pair(module: str):
    name = f"{module}.ipynb"
    return (nbformat.read(str(SOLUTIONS_DIR / module / name), as_version=4),
            nbformat.read(str(COURSE_DIR / module / name), as_version=4))


@pytest.mark.parametrize("module", PARAMS)
def test_course_holds_no_solution_and_no_hidden_test(module: str) -> None:
    source, _ = _pair(module)
    assert region_lines(source, "solution"), f"solutions/{module} has no solution region?"
    found = leaked(source, _texts(COURSE_DIR / module))
    assert not found, f"course/{module} leaks:\n" + "\n".join(found[:20])


@pytest.mark.parametrize("module", PARAMS)
def test_every_graded_cell_in_course_carries_its_checksum(module: str) -> None:
    _, release = _pair(module)
    graded = [c for c in release.cells if c.get("metadata", {}).get("nbgrader", {}).get("grade")]
    assert graded, f"course/{module} has no graded cell"
    bad = unsealed(release)
    assert not bad, f"course/{module}: " + "; ".join(bad)


# --- the detectors fail when they should --------------------------------------------------------
def _cell(source: str, gid: str, **flags) -> nbformat.NotebookNode:
    meta = {"grade": False, "solution": False, "locked": False, "schema_version": 3,
            "grade_id": gid, **flags}
    if meta["grade"]:
        meta.setdefault("points", 1)
    cell = nbformat.v4.new_code_cell(source, metadata={"nbgrader": meta})
    cell.metadata.nbgrader["checksum"] = compute_checksum(cell)
    return cell


SOURCE = nbformat.v4.new_notebook(cells=[
    _cell("def f(x):\n    ### BEGIN SOLUTION\n    return x * 41 + 1\n    ### END SOLUTION",
          "f_answer", solution=True),
    _cell("assert f(1) == 42\n### BEGIN HIDDEN TESTS\nassert f(2) == 83, 'secret'\n"
          "### END HIDDEN TESTS", "f_test", grade=True, locked=True),
])
RELEASE = nbformat.v4.new_notebook(cells=[
    _cell("def f(x):\n    # YOUR CODE HERE\n    raise NotImplementedError()", "f_answer",
          solution=True),
    _cell("assert f(1) == 42", "f_test", grade=True, locked=True),
])


def _texts_of(nb) -> dict[str, str]:
    return {"m.ipynb": "\n".join(normalise(ln) for c in nb.cells for ln in c.source.split("\n"))}


def test_a_clean_release_passes_the_detectors() -> None:
    assert leaked(SOURCE, _texts_of(RELEASE)) == []
    assert unsealed(RELEASE) == []


@pytest.mark.parametrize("leak, words", [
    (lambda nb: setattr(nb.cells[0], "source", SOURCE.cells[0].source), "delimiter"),
    (lambda nb: setattr(nb.cells[0], "source", "def f(x):\n    return x * 41 + 1"),
     "solution line"),
    (lambda nb: setattr(nb.cells[1], "source", "assert f(1) == 42\nassert f(2) == 83, 'secret'"),
     "hidden line"),
])
def test_leak_detector_finds_a_planted_leak(leak, words: str) -> None:
    nb = copy.deepcopy(RELEASE)
    leak(nb)
    found = leaked(SOURCE, _texts_of(nb))
    assert any(words in f for f in found), f"planted leak not found: {found}"


@pytest.mark.parametrize("tamper, words", [
    (lambda nb: nb.cells[1].metadata.nbgrader.pop("checksum"), "no checksum"),
    (lambda nb: setattr(nb.cells[1], "source", "pass"), "not nbgrader's"),
])
def test_seal_detector_finds_a_missing_or_wrong_checksum(tamper, words: str) -> None:
    nb = copy.deepcopy(RELEASE)
    tamper(nb)
    assert any(words in f for f in unsealed(nb)), unsealed(nb)
