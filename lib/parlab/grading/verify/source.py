"""What of a notebook the verifier runs, and where, read as source text (never executed here).

- `learner_source(nb)`: the code the learner's processes (the ranks and the learner's stand-in
  for the kernel) run before a check: the answer cells' imports, definitions and assignments
  (a bare call such as `print(...)` or `setattr(...)` is left out: nothing a check needs),
  the definitions of other cells that those use, and the imports they all use.
- `answer_names(nb)`: the names the answer cells define; the verifier binds each to an
  `Answer` (or to its value, when it is plain data).
- `released_source(nb)`: what the verifier runs of the instructor's notebook before the tests:
  its imports, definitions and the assignments that use no answer, outside answer and test
  cells, that the tests name (`LLAMA3_70B = planner.Model(...)`) or what those use; calls on
  their own, a print or a figure, are left out.
- `graded_cells(nb)`: (grade id, source, points) of every graded cell, hidden tests included (in
  the graded notebook nbgrader has put them back from the gradebook); `split_hidden` parts a
  test cell's code into what the learner sees and its hidden tests.
"""

from __future__ import annotations

import ast
import re
from typing import Any

from parlab.grading.base.cells import grade_id, is_answer_cell, is_graded_cell

__all__ = ["learner_source", "answer_names", "released_source", "graded_cells", "split_hidden"]
_HIDDEN = re.compile(r"^[ \t]*#+[ \t]*BEGIN HIDDEN TESTS[ \t]*\n(.*?)"
                     r"^[ \t]*#+[ \t]*END HIDDEN TESTS[ \t]*(\n|$)", re.DOTALL | re.MULTILINE)

_DEFS = (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)
_IMPORTS = (ast.Import, ast.ImportFrom)
_ASSIGNS = (ast.Assign, ast.AnnAssign, ast.AugAssign)


def _code_cells(nb: Any) -> list[Any]:
    return [c for c in nb.cells if c.cell_type == "code"]


def _parse(text: str) -> list[ast.stmt]:
    """The cell's statements; a cell that does not parse (or IPython magics) gives none."""
    lines = [ln for ln in text.splitlines() if not ln.lstrip().startswith(("%", "!"))]
    try:
        return ast.parse("\n".join(lines)).body
    except SyntaxError:
        return []


def _bound(stmt: ast.stmt) -> set[str]:
    """Top-level names a statement binds."""
    if isinstance(stmt, _DEFS):
        return {stmt.name}
    if isinstance(stmt, _IMPORTS):
        return {(a.asname or a.name).split(".")[0] for a in stmt.names if a.name != "*"}
    targets = stmt.targets if isinstance(stmt, ast.Assign) else [getattr(stmt, "target", None)]
    return {n.id for t in targets if t is not None for n in ast.walk(t)
            if isinstance(n, ast.Name)}


def _used(stmt: ast.AST) -> set[str]:
    return {n.id for n in ast.walk(stmt) if isinstance(n, ast.Name)}


def _answers(nb: Any) -> list[ast.stmt]:
    return [s for c in _code_cells(nb) if is_answer_cell(c) for s in _parse(c.source)
            if isinstance(s, _DEFS + _IMPORTS + _ASSIGNS)]


def answer_names(nb: Any) -> list[str]:
    """Names the answer cells define (def, class, assignment), in order."""
    names: dict[str, None] = {}
    for s in _answers(nb):
        if not isinstance(s, _IMPORTS):
            names.update(dict.fromkeys(sorted(_bound(s))))
    return list(names)


def learner_source(nb: Any) -> str:
    """The learner's code the ranks run (see the module doc), as one Python source."""
    answers = _answers(nb)
    others = [s for c in _code_cells(nb) if not is_answer_cell(c) and not is_graded_cell(c)
              for s in _parse(c.source) if isinstance(s, _DEFS + _IMPORTS)]
    used = set().union(*(_used(s) for s in answers)) if answers else set()
    chosen: list[ast.stmt] = []
    grew = True
    while grew:  # definitions of other cells the answers use, and what those use
        grew = False
        for s in others:
            if isinstance(s, _DEFS) and s not in chosen and s.name in used:
                chosen.append(s)
                used |= _used(s)
                grew = True
    imports = [s for s in others if isinstance(s, _IMPORTS) and _bound(s) & used]
    keep = imports + [s for s in others if s in chosen] + answers
    return "\n\n".join(ast.unparse(s) for s in keep) + "\n"


def released_source(nb: Any) -> str:
    """The instructor's imports, definitions and constants, outside answer and test cells,
    that the tests need (a figure or a demo's result is left out)."""
    answers = set(answer_names(nb))
    found: list[ast.stmt] = []
    for c in _code_cells(nb):
        if is_answer_cell(c) or is_graded_cell(c):
            continue
        for s in _parse(c.source):
            if isinstance(s, _DEFS + _IMPORTS) or (isinstance(s, _ASSIGNS)
                                                  and not _used(s) & answers):
                found.append(s)  # a constant, or one computed by the course's library
    needed = set().union(*(_used(ast.parse(code)) for _, code, _ in graded_cells(nb))) \
        if graded_cells(nb) else set()
    keep: list[ast.stmt] = []
    grew = True
    while grew:  # what the tests name, and what that uses
        grew = False
        for s in found:
            if s not in keep and _bound(s) & needed:
                keep.append(s)
                needed |= _used(s)
                grew = True
    return "\n\n".join(ast.unparse(s) for s in found if s in keep) + "\n"


def graded_cells(nb: Any) -> list[tuple[str, str, float]]:
    """(grade id, source, points) of every graded code cell, in order."""
    return [(str(grade_id(c)), c.source, float(c.metadata.nbgrader.get("points") or 0))
            for c in _code_cells(nb) if is_graded_cell(c) and not is_answer_cell(c)]


def split_hidden(source: str) -> tuple[str, str]:
    """(the visible code of a test cell, the code of its hidden tests): nbgrader's
    `### BEGIN HIDDEN TESTS ... ### END HIDDEN TESTS` regions taken out, and their bodies."""
    hidden = "".join(m.group(1) for m in _HIDDEN.finditer(source))
    return _HIDDEN.sub("", source), hidden
