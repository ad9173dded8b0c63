"""course/ is exactly what `make release` makes from solutions/, and notebooks are stored clean.

- every module in solutions/ regenerates into a temporary folder identical to course/
  (one `nbgrader generate_assignment "*" --no-db` call for all modules);
- every notebook in solutions/ and course/ is committed without outputs or execution counts;
- solutions/ and course/ hold the same modules, each with its <module>.ipynb.
"""

from __future__ import annotations

import json
from pathlib import Path

import nbformat
import pytest

from parlab.grading import COURSE_DIR, SOLUTIONS_DIR, generate_release, list_modules

SOURCE_MODULES = list_modules(SOLUTIONS_DIR)
# TODO(lead): remove this skip once module 00 lands; from then on an empty solutions/ is an error.
NO_MODULES = "solutions/ has no module yet: nothing to compare (remove once module 00 lands)"


def _params(items: list) -> list:
    """The items to parametrise over, or one param that skips, saying why, when there are none."""
    return items or [pytest.param(None, marks=pytest.mark.skip(reason=NO_MODULES))]


def _module_files(folder: Path) -> list[str]:
    """Files of a module folder, relative; editor/cache clutter (hidden, __pycache__) ignored."""
    return sorted(
        str(p.relative_to(folder)) for p in folder.rglob("*")
        if p.is_file() and not any(part.startswith(".") or part == "__pycache__"
                                   for part in p.relative_to(folder).parts)
        and p.suffix != ".pyc"
    )


def _first_difference(expected: object, actual: object, where: str = "") -> str | None:
    """Path and values of the first place two JSON values differ, or None if equal."""
    if isinstance(expected, dict) and isinstance(actual, dict):
        for key in sorted(set(expected) | set(actual)):
            if key not in actual:
                return f"{where}.{key} missing in course/"
            if key not in expected:
                return f"{where}.{key} present in course/ but not in a fresh release"
            found = _first_difference(expected[key], actual[key], f"{where}.{key}")
            if found:
                return found
        return None
    if expected != actual:
        return f"{where}: fresh release has {expected!r:.200}, course/ has {actual!r:.200}"
    return None


def _notebook_difference(expected_path: Path, actual_path: Path) -> str | None:
    expected = json.loads(expected_path.read_text())
    actual = json.loads(actual_path.read_text())
    ecells, acells = expected.get("cells", []), actual.get("cells", [])
    if len(ecells) != len(acells):
        return f"{len(ecells)} cells in a fresh release, {len(acells)} in course/"
    for index, (ecell, acell) in enumerate(zip(ecells, acells, strict=True)):
        # The readable differences first: the cell's kind and text, then its metadata.
        found = (_first_difference(ecell.get("cell_type"), acell.get("cell_type"), ".cell_type")
                 or _first_difference(ecell.get("source"), acell.get("source"), ".source")
                 or _first_difference(ecell, acell))
        if found:
            grade_id = ecell.get("metadata", {}).get("nbgrader", {}).get("grade_id")
            return f"cell {index}" + (f" ({grade_id})" if grade_id else "") + f": {found}"
    top_e = {k: v for k, v in expected.items() if k != "cells"}
    top_a = {k: v for k, v in actual.items() if k != "cells"}
    return _first_difference(top_e, top_a, "notebook")


@pytest.fixture(scope="module")
def fresh_release(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Every module of solutions/ released into a temporary folder, in one nbgrader call."""
    out = tmp_path_factory.mktemp("fresh_release")
    run = generate_release("*", release_dir=out)
    print(f"nbgrader generate_assignment * --no-db: {run.seconds:.1f} s")
    return out


@pytest.mark.parametrize("module", _params(SOURCE_MODULES))
def test_course_is_not_stale(module: str, fresh_release: Path) -> None:
    committed, fresh = COURSE_DIR / module, fresh_release / module
    hint = f"course/{module} is stale; run `make release` and commit course/"
    assert committed.is_dir(), f"course/{module} is missing; run `make release`"
    assert _module_files(committed) == _module_files(fresh), f"{hint} (files differ)"
    for name in _module_files(fresh):
        if name.endswith(".ipynb"):
            difference = _notebook_difference(fresh / name, committed / name)
            assert difference is None, f"{hint}: {name}: {difference}"
        else:
            assert (fresh / name).read_bytes() == (committed / name).read_bytes(), (
                f"{hint}: {name} differs")


NOTEBOOKS = sorted(
    str(p.relative_to(SOLUTIONS_DIR.parent))
    for top in (SOLUTIONS_DIR, COURSE_DIR)
    for p in top.rglob("*.ipynb")
    if ".ipynb_checkpoints" not in p.parts
)


@pytest.mark.parametrize("notebook", _params(NOTEBOOKS))
def test_notebook_is_stored_without_outputs(notebook: str) -> None:
    nb = json.loads((SOLUTIONS_DIR.parent / notebook).read_text())
    dirty = []
    for index, cell in enumerate(nb.get("cells", [])):
        grade_id = cell.get("metadata", {}).get("nbgrader", {}).get("grade_id")
        label = f"cell {index}" + (f" ({grade_id})" if grade_id else "")
        if cell.get("outputs"):
            dirty.append(f"{label} has outputs")
        if cell.get("execution_count") is not None:
            dirty.append(f"{label} has execution_count {cell['execution_count']}")
    if "widgets" in nb.get("metadata", {}):
        dirty.append("notebook metadata holds saved widget state")
    assert not dirty, (f"{notebook} is stored with outputs: {'; '.join(dirty)}. Clear them "
                       "(Edit > Clear Outputs of All Cells) and save; for course/, run "
                       "`make release`")


def test_every_module_is_released_and_nothing_else() -> None:
    source, released = set(SOURCE_MODULES), set(list_modules(COURSE_DIR))
    if not source and not released:
        pytest.skip(NO_MODULES)
    assert not source - released, (
        f"not released: {sorted(source - released)}; run `make release` and commit course/")
    assert not released - source, (
        f"in course/ but not in solutions/: {sorted(released - source)}; course/ is generated "
        "from solutions/ only, so delete those folders (or restore their source)")
    for top in (SOLUTIONS_DIR, COURSE_DIR):
        for module in source:
            notebook = top / module / f"{module}.ipynb"
            assert notebook.is_file(), f"{notebook.relative_to(top.parent)} is missing"


@pytest.mark.parametrize("module", SOURCE_MODULES)
def test_every_notebook_ends_with_the_learners_standing(module):
    nb = nbformat.read(SOLUTIONS_DIR / module / f"{module}.ipynb", as_version=4)
    code = [c for c in nb.cells if c.cell_type == "code"]
    assert "standing()" in code[-1].source, "the last code cell must call standing()"
    how = next(c.source for c in nb.cells if c.source.startswith("## How to work through"))
    assert "standing()" in how and "Validate" in how and f"make check MODULE={module}" in how
