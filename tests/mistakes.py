"""Shared by tests/test_mistakes.py and tests/test_mistakes_extra.py: run a module's answers
like notebook cells, against the checks its table (tests/mistake_tables/) names.

The solutions notebook's imports cell and answer cells (BEGIN/END SOLUTION lines dropped) run
into one fresh module that is not in sys.modules, so cloudpickle ships its classes to the
ranks by value, as it does for a learner's cells; a mistake file from autograder/mistakes/
runs on top, replacing what it defines. Each mistake file lists in CAUGHT_BY the checks that
must reject it and a phrase the message must contain; optionally SIZES = {check: world sizes}
(instead of the table's) and WORLD_SIZES (the only sizes it fails on: a ring that is right on
2 ranks, where both neighbours are one rank). Each check of an entry runs once, at the first
of the table's sizes it fails on: the other sizes run in the notebooks' hidden tests. An entry
caught only at sizes the visible tests do not run is also run through the visible part of its
test cell (`visible:<grade id>`), which must fail it with the same phrase: what standing()
and Validate run never gives full marks to an answer the hidden tests fail.
"""

from __future__ import annotations

import ast
import functools
import itertools
import re
import types
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import nbformat
import pytest
import readable
from conftest import ROOT

from parlab.check import CheckFailed
from parlab.grading import grade_id, is_answer_cell
from parlab.grading.verify.source import split_hidden
from parlab.launch import RankError

DELIMITER = re.compile(r"^\s*### (BEGIN|END) SOLUTION\s*$")
VISIBLE = "visible:"  # a run of a test cell's visible part, any failure (Table.runs)
_counter = itertools.count()
Check = Callable[[types.ModuleType, int], object]  # run one check on a learner's namespace


@functools.cache
def _learner_cells(notebook: Path) -> tuple[tuple[str, str], ...]:
    """(cell id, source without the SOLUTION lines) of the imports cell and the answer cells."""
    nb = nbformat.read(notebook, as_version=4)
    cells = [c for c in nb.cells if c.cell_type == "code"
             and ("imports" in c.metadata.get("tags", []) or is_answer_cell(c))]
    return tuple((c.get("id", "?"), "\n".join(ln for ln in c.source.splitlines()
                                              if not DELIMITER.match(ln))) for c in cells)


def learner_namespace(notebook: Path, *overlays: str, answers: int) -> types.ModuleType:
    """The notebook's imports and its `answers` answer cells, then each overlay, in one module."""
    module = types.ModuleType(f"learner_notebook_{next(_counter)}")  # not in sys.modules
    cells = _learner_cells(notebook)
    assert len(cells) == answers + 1, f"expected the imports cell and {answers} answer cells"
    for cell_id, source in cells:
        exec(compile(source, f"<cell {cell_id}>", "exec"), module.__dict__)
    for index, source in enumerate(overlays):
        exec(compile(source, f"<overlay {index}>", "exec"), module.__dict__)
    return module


@functools.cache
def _test_cells(notebook: Path) -> dict[str, str]:
    """Grade id -> source (hidden tests included) of every graded cell of the notebook."""
    return {str(grade_id(c)): c.source for c in nbformat.read(notebook, as_version=4).cells
            if grade_id(c)}


def cell_source(notebook: Path, gid: str) -> str:
    """The source of the notebook's test cell `gid`, hidden tests included."""
    cells = _test_cells(notebook)
    assert gid in cells, f"no test cell {gid}"
    return cells[gid]


def hidden(module: str, gid: str, *, visible_only: bool = False) -> Check:
    """A check that runs the solutions notebook's test cell `gid` as the grader does; with
    `visible_only`, the part a learner's release holds (what standing() and Validate run)."""
    notebook = ROOT / "solutions" / module / f"{module}.ipynb"

    def run(ns: types.ModuleType, t: int) -> None:
        source = cell_source(notebook, gid)
        source = split_hidden(source)[0] if visible_only else source
        exec(compile(source, f"<{gid}>", "exec"), ns.__dict__)
    return run


def entry_value(path: Path, name: str) -> Any:
    """A mistake file's top-level constant `name` (a literal), or None."""
    for node in ast.parse(path.read_text()).body:
        if isinstance(node, ast.Assign) and getattr(node.targets[0], "id", "") == name:
            return ast.literal_eval(node.value)
    return None


def caught_by(path: Path) -> dict[str, str]:
    """A mistake file's CAUGHT_BY = {check name: phrase its message must contain}."""
    found = entry_value(path, "CAUGHT_BY")
    assert found is not None, f"{path.name} has no CAUGHT_BY = {{check: phrase}}"
    return found


def caught_message(run_check: Callable[[], object], *, phrase: str, where: str) -> str:
    """run_check() must fail, with CheckFailed or a rank's RankError, saying `phrase`; the
    message, for the caller's further asserts (most also want it to name the rank)."""
    with pytest.raises((CheckFailed, RankError)) as info:
        run_check()
    message = str(info.value)
    assert phrase in message, f"{where} said:\n{message}"
    lines = readable.shown(info.value._render_traceback_())
    why = readable.unreadable(lines)
    assert why is None, f"{where} reads badly in a notebook, {why}:\n" + "\n".join(lines)
    return message


@dataclass(frozen=True)
class Table:
    """What is particular to one module's mistakes tests (one file in tests/mistake_tables/);
    tests/test_mistakes.py runs the same tests over every table."""

    module: str  # "02_tensor_parallel": solutions/<module>/ and autograder/mistakes/<module>/
    answers: int  # answer cells in the solutions notebook
    checks: Mapping[str, Check]  # CAUGHT_BY's names -> the check as its test cell calls it
    required: frozenset[str]  # the entries the issues asked for: none may go missing
    sizes: Mapping[str, tuple[int, ...]] = field(default_factory=dict)  # default (2,)
    solution_sizes: Mapping[str, tuple[int, ...]] = field(default_factory=dict)  # else sizes;
    # () = the solution of that check is not run here (the reason in the table)
    where: Mapping[str, tuple[str, ...]] = field(default_factory=dict)  # a check's message
    # names one of these (the rank, the call)...
    where_exempt: tuple[str, ...] = ()  # ...unless it says one of these (a hang names no rank)
    max_seconds: float | None = None  # the longest a mistake may take to be caught, per run
    slow_checks: frozenset[str] = frozenset()  # marked slow, for the mistakes and the solutions
    slow_entries: frozenset[str] = frozenset()
    slow_solutions: frozenset[str] = frozenset()
    reexports: Mapping[str, tuple[str, str]] = field(default_factory=dict)  # how an answer
    # could hand back the course's own code -> (the check that refuses it, the source)
    refusal: str = "the course's own reference"  # a refusal's message matches (re.search)
    refusal_starts: Mapping[str, str] = field(default_factory=dict)  # how -> regex at the start
    same_refusal: tuple[tuple[str, str], ...] = ()  # (bare, wrapped): refused in the same words

    @property
    def notebook(self) -> Path:
        return ROOT / "solutions" / self.module / f"{self.module}.ipynb"

    @property
    def folder(self) -> Path:
        return ROOT / "autograder" / "mistakes" / self.module

    def namespace(self, *overlays: str) -> types.ModuleType:
        return learner_namespace(self.notebook, *overlays, answers=self.answers)

    def entries(self) -> list[Path]:
        return sorted(self.folder.glob("*.py"))

    def sizes_of(self, check: str) -> tuple[int, ...]:
        return self.sizes.get(check, (2,))

    def check(self, name: str) -> Check:
        """The check CAUGHT_BY names, or `visible:<grade id>`: that test cell's visible part."""
        if name.startswith(VISIBLE):
            return hidden(self.module, name.removeprefix(VISIBLE), visible_only=True)
        return self.checks[name]

    def test_cell(self, check: str) -> str:
        """The grade id of the test cell whose visible part calls `check` (or `hidden:<id>`'s)."""
        if check.startswith("hidden:"):
            return check.removeprefix("hidden:")
        gids = [gid for gid, source in _test_cells(self.notebook).items()
                if f"{check}(" in split_hidden(source)[0]]
        assert len(gids) == 1, f"{check}: called by the visible part of test cells {gids}"
        return gids[0]

    def runs(self, path: Path) -> list[tuple[str, str, int]]:
        """(check, phrase, world size) of every run that must catch the entry at `path`: each
        check of its CAUGHT_BY once, at the first of the table's sizes (the visible test's:
        the message a learner meets first), or the first of WORLD_SIZES where it names the
        only sizes the entry fails on; at every size of the entry's own SIZES."""
        own, only = entry_value(path, "SIZES") or {}, entry_value(path, "WORLD_SIZES")
        runs = []
        for check, phrase in caught_by(path).items():
            sizes = [t for t in self.sizes_of(check) if only is None or t in only][:1]
            runs += [(check, phrase, t) for t in own.get(check, sizes)]
        if not any(not c.startswith("hidden:") and t == self.sizes_of(c)[0] for c, _, t in runs):
            # caught only where the hidden tests look: the visible tests must fail it too,
            # or standing() and Validate would show full marks for it
            cells = {self.test_cell(c): phrase for c, phrase in reversed(caught_by(path).items())}
            runs += [(VISIBLE + gid, phrase, 0) for gid, phrase in cells.items()]
        return runs

    def mistake_sizes(self, check: str) -> tuple[int, ...]:
        """Every size some entry of the corpus runs `check` at."""
        return tuple(sorted({t for path in self.entries() for c, _, t in self.runs(path)
                             if c == check}))

    def is_slow(self, path: Path) -> bool:
        return path.stem in self.slow_entries or any(
            check in self.slow_checks for check in caught_by(path))
