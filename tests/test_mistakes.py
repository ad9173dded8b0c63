"""Every module's graded checks catch its mistakes corpus, pass its solutions, refuse the
course's own code.

One table a module (tests/mistake_tables/) says what is particular to it; the tests here are
the same for all. A learner's notebook is rebuilt as a kernel holds it (tests/mistakes.py):
the solutions notebook's imports cell and answer cells run into one fresh module, and a
mistake file from autograder/mistakes/<module>/ runs on top, replacing the names it defines,
as a learner's wrong cell would. Each mistake file lists in CAUGHT_BY the checks that must
reject it and a phrase the message must contain; every check of it runs once, at the visible
test's world size unless the entry names the sizes it fails on (tests/mistakes.py, Table.runs;
the other sizes run in the hidden tests of the course run), each as a fresh kernel would (no
outcome of an earlier check remembered).
Module-specific tests that follow no common pattern: tests/test_mistakes_extra.py.
"""

from __future__ import annotations

import ast
import re
import textwrap
import time
import traceback
from pathlib import Path

import mistakes
import nbformat
import pytest
from conftest import ROOT
from mistake_tables import BY_MODULE, TABLES
from mistakes import Table

from parlab.check import CheckFailed, _harness, reset_outcomes
from parlab.grading import grade_id

pytestmark = pytest.mark.usefixtures("no_orphans")
SLOW = (pytest.mark.slow,)


def _caught(table: Table, path: Path, check: str, phrase: str, t: int) -> None:
    """One run: `check` on `t` ranks rejects the entry saying `phrase`, names the place
    where the table says it must, and in time."""
    reset_outcomes()  # a fresh kernel: no earlier exercise failed
    ns = table.namespace(path.read_text())
    where = f"{path.name} under {check} on {t} ranks"
    start = time.monotonic()
    message = mistakes.caught_message(lambda: table.check(check)(ns, t), phrase=phrase,
                                      where=where)
    took = time.monotonic() - start
    names = table.where.get(check, ())
    if names and not any(w in message for w in table.where_exempt):
        assert any(w in message for w in names), f"{where} names none of {names}:\n{message}"
    if table.max_seconds is not None:
        assert took < table.max_seconds, f"{where} took {took:.1f} s to be caught"


ENTRIES = [pytest.param(table, path, id=f"{table.module}-{path.stem}",
                        marks=SLOW if table.is_slow(path) else ())
           for table in TABLES for path in table.entries()]


@pytest.mark.parametrize("table, path", ENTRIES)
def test_mistake_is_caught(table: Table, path: Path) -> None:
    """Every check of the entry's CAUGHT_BY, at its world size, rejects it with the phrase."""
    runs = table.runs(path)
    assert runs, f"{path.name}: no check runs it (CAUGHT_BY, SIZES and WORLD_SIZES)"
    failures = []
    for check, phrase, t in runs:
        try:
            _caught(table, path, check, phrase, t)
        except (AssertionError, pytest.fail.Exception) as exc:  # every run, not the first
            failures.append(f"--- {check} on {t} ranks:\n{exc}")
        except Exception:  # the check itself crashed: its traceback
            failures.append(f"--- {check} on {t} ranks:\n{traceback.format_exc()}")
    assert not failures, f"{len(failures)} of {len(runs)} runs failed\n" + "\n".join(failures)


FOLDERS = sorted(p for p in (ROOT / "autograder" / "mistakes").iterdir() if p.is_dir())


@pytest.mark.parametrize("folder", FOLDERS, ids=[p.name for p in FOLDERS])
def test_corpus_is_complete_and_documented(folder: Path) -> None:
    """The issues' mistakes are all there, each runs under known checks, and README.md lists
    exactly the folder's files, with the phrase each message must contain."""
    table = BY_MODULE.get(folder.name)
    assert table is not None, f"no table in tests/mistake_tables/ for {folder.name}"
    names = {p.stem for p in table.entries()}
    assert table.required <= names, f"missing mistakes: {sorted(table.required - names)}"
    readme = (folder / "README.md").read_text()
    listed = set(re.findall(r"^\|\s*`(\w+)\.py`", readme, flags=re.M))
    assert listed == names, (f"README.md lists {sorted(listed - names)} that are not there "
                             f"and not {sorted(names - listed)}")
    for path in table.entries():
        for check, phrase in mistakes.caught_by(path).items():
            assert check in table.checks, f"{path.name}: unknown check {check}"
            assert phrase in readme, f"README.md does not quote {path.name}'s {phrase!r}"


def _solution_sizes(table: Table, check: str) -> tuple[int, ...]:
    """The sizes the mistakes run at, so each mistake has a passing control beside it; the
    other sizes of a table's solution_sizes run in the notebooks' hidden tests, through the
    course run (tests/test_notebooks.py), so they are not run twice."""
    wanted = table.solution_sizes.get(check, table.sizes_of(check))
    return tuple(t for t in wanted if t in table.mistake_sizes(check)) or wanted[:1]


# A `hidden:<grade id>` check is that test cell of the solutions notebook, which the course
# run already runs on the solutions (tests/test_notebooks.py (a)): no control of its own.
SOLUTIONS = [pytest.param(table, check, t, id=f"{table.module}-{check}-t{t}",
                          marks=SLOW if check in table.slow_checks | table.slow_solutions
                          else ())
             for table in TABLES for check in sorted(table.checks)
             if not check.startswith("hidden:") for t in _solution_sizes(table, check)]


@pytest.mark.parametrize("table, check, t", SOLUTIONS)
def test_solutions_pass(table: Table, check: str, t: int) -> None:
    """The solutions' answers pass the checks the mistakes fail: every graded check that ran
    (a test cell runs several) recorded a pass in the kernel (parlab.check.exercise)."""
    table.checks[check](table.namespace(), t)
    outcomes = dict(_harness._OUTCOMES)
    assert outcomes, f"{check} on {t} ranks judged nothing"
    failed = sorted(key for key, passed in outcomes.items() if not passed)
    assert not failed, f"{check} on {t} ranks: {failed} recorded a failure"


NOTEBOOKS = sorted((ROOT / "solutions").glob("*/*.ipynb"))


@pytest.mark.parametrize("notebook", NOTEBOOKS, ids=[p.stem for p in NOTEBOOKS])
def test_hidden_asserts_carry_messages(notebook: Path) -> None:
    """A bare assert in a hidden test shows nothing once feedback hides the line."""
    cells = [c for c in nbformat.read(notebook, as_version=4).cells
             if c.cell_type == "code" and "### BEGIN HIDDEN TESTS" in c.source]
    assert cells, f"{notebook.name} has no hidden tests"
    for cell in cells:
        asserts = [n for n in ast.walk(ast.parse(cell.source)) if isinstance(n, ast.Assert)]
        bare = [n.lineno for n in asserts
                if n.msg is None or (isinstance(n.msg, ast.Constant) and not n.msg.value)]
        assert not bare, f"{grade_id(cell)}: assert without a message on lines {bare}"


def _refusal(table: Table, how: str) -> str:
    check, source = table.reexports[how]
    ns = table.namespace(textwrap.dedent(source))
    with pytest.raises(CheckFailed, match=table.refusal) as info:
        table.checks[check](ns, table.sizes_of(check)[0])
    return str(info.value)


REEXPORTS = [pytest.param(table, how, id=f"{table.module}-{how}")
             for table in TABLES for how in sorted(table.reexports)]


@pytest.mark.parametrize("table, how", REEXPORTS)
def test_reference_implementation_is_rejected(table: Table, how: str) -> None:
    message = _refusal(table, how)
    if how in table.refusal_starts:
        assert re.match(table.refusal_starts[how], message, flags=re.S), message


SAME = [pytest.param(table, bare, wrapped, id=f"{table.module}-{bare}-{wrapped}")
        for table in TABLES for bare, wrapped in table.same_refusal]


@pytest.mark.parametrize("table, bare, wrapped", SAME)
def test_a_wrapper_is_refused_with_the_words_of_a_bare_reexport(table: Table, bare: str,
                                                                 wrapped: str) -> None:
    assert _refusal(table, wrapped) == _refusal(table, bare)
