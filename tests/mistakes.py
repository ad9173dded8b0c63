"""Shared by the tests/test_mistakes_*.py files: run a module's answers like notebook cells.

The solutions notebook's imports cell and answer cells (BEGIN/END SOLUTION lines dropped) run
into one fresh module that is not in sys.modules, so cloudpickle ships its classes to the
ranks by value, as it does for a learner's cells; a mistake file from autograder/mistakes/
runs on top, replacing what it defines. Each mistake file lists in CAUGHT_BY the checks that
must reject it and a phrase the message must contain.
"""

from __future__ import annotations

import ast
import itertools
import re
import types
from collections.abc import Callable, Iterable
from pathlib import Path

import nbformat
import pytest

from parlab.check import CheckFailed
from parlab.grading import is_answer_cell
from parlab.launch import RankError

DELIMITER = re.compile(r"^\s*### (BEGIN|END) SOLUTION\s*$")
_counter = itertools.count()


def learner_namespace(notebook: Path, *overlays: str, answers: int) -> types.ModuleType:
    """The notebook's imports and its `answers` answer cells, then each overlay, in one module."""
    nb = nbformat.read(notebook, as_version=4)
    module = types.ModuleType(f"learner_notebook_{next(_counter)}")  # not in sys.modules
    cells = [c for c in nb.cells if c.cell_type == "code"
             and ("imports" in c.metadata.get("tags", []) or is_answer_cell(c))]
    assert len(cells) == answers + 1, f"expected the imports cell and {answers} answer cells"
    for cell in cells:
        source = "\n".join(ln for ln in cell.source.splitlines() if not DELIMITER.match(ln))
        exec(compile(source, f"<cell {cell.get('id', '?')}>", "exec"), module.__dict__)
    for index, source in enumerate(overlays):
        exec(compile(source, f"<overlay {index}>", "exec"), module.__dict__)
    return module


def caught_by(path: Path) -> dict[str, str]:
    """A mistake file's CAUGHT_BY = {check name: phrase its message must contain}."""
    for node in ast.parse(path.read_text()).body:
        if isinstance(node, ast.Assign) and getattr(node.targets[0], "id", "") == "CAUGHT_BY":
            return ast.literal_eval(node.value)
    raise AssertionError(f"{path.name} has no CAUGHT_BY = {{check: phrase}}")


def assert_corpus_documented(folder: Path, required: set[str], checks: dict) -> None:
    """The issue's mistakes are all there, each runs under known checks, and README.md lists
    every file with the phrase its message must contain."""
    names = {p.stem for p in folder.glob("*.py")}
    assert required <= names, f"missing mistakes: {sorted(required - names)}"
    readme = (folder / "README.md").read_text()
    for path in sorted(folder.glob("*.py")):
        assert f"`{path.name}`" in readme, f"README.md does not list {path.name}"
        for check, phrase in caught_by(path).items():
            assert check in checks, f"{path.name}: unknown check {check}"
            assert phrase in readme, f"README.md does not quote {path.name}'s {phrase!r}"


def cases(folder: Path, sizes: Callable[[str], Iterable[int]] = lambda check: (2, 4)) -> list:
    """One pytest case (path, check, phrase, t) per mistake file, check that must catch it, and
    world size t."""
    return [pytest.param(path, check, phrase, t, id=f"{path.stem}-{check}-t{t}")
            for path in sorted(folder.glob("*.py"))
            for check, phrase in caught_by(path).items() for t in sizes(check)]


def caught_message(run_check: Callable[[], object], *, phrase: str, where: str) -> str:
    """run_check() must fail, with CheckFailed or a rank's RankError, saying `phrase`; the
    message, for the caller's further asserts (most also want it to name the rank)."""
    with pytest.raises((CheckFailed, RankError)) as info:
        run_check()
    message = str(info.value)
    assert phrase in message, f"{where} said:\n{message}"
    return message
