"""Which cell defines a name, so that a NameError can say the defining cell did not finish.

After `os._exit` (or a crash, a hang, an exception) in an answer cell, the grader starts a new
kernel and re-runs only the cells that had succeeded; the names that cell would have defined
are then missing, and every later test that uses them fails with a bare `NameError`. The
note added here says which cell (by nbgrader grade id) defines the name and how it ended, so
the learner fixes that cell rather than the test.
"""

from __future__ import annotations

import ast
import re

from nbformat import NotebookNode

from parlab.grading.base.cells import cell_error, grade_id

_UNDEFINED = re.compile(r"name '([A-Za-z_]\w*)' is not defined")
_MAGIC = re.compile(r"^\s*[%!]")


def defined_names(source: str) -> set[str]:
    """Names a cell binds at its top level: defs, classes, imports, assignments, loop targets
    (also inside top-level if/for/while/with/try blocks). Magics are skipped; a cell that does
    not parse defines nothing."""
    text = "\n".join("pass" if _MAGIC.match(ln) else ln for ln in source.splitlines())
    try:
        tree = ast.parse(text)
    except SyntaxError:
        return set()
    names: set[str] = set()
    todo = list(tree.body)
    while todo:
        node = todo.pop()
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
            continue
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            names.update((a.asname or a.name).split(".")[0] for a in node.names)
            continue
        for target in _targets(node):
            names.update(n.id for n in ast.walk(target) if isinstance(n, ast.Name))
        for field in ("body", "orelse", "finalbody", "handlers"):
            todo.extend(getattr(node, field, []) or [])
    return names


def _targets(node: ast.AST) -> list[ast.AST]:
    if isinstance(node, ast.Assign):
        return list(node.targets)
    if isinstance(node, (ast.AnnAssign, ast.AugAssign, ast.For, ast.AsyncFor)):
        return [node.target]
    if isinstance(node, (ast.With, ast.AsyncWith)):
        return [item.optional_vars for item in node.items if item.optional_vars is not None]
    if isinstance(node, ast.NamedExpr):
        return [node.target]
    return []


def unfinished_definer(cells: list[NotebookNode], index: int,
                       name: str) -> tuple[int, tuple[str, str]] | None:
    """(index, its error) of the last code cell before `index` that defines `name`, if that
    cell ended with an error (did not finish); None when it finished or no cell defines it."""
    for i in range(index - 1, -1, -1):
        cell = cells[i]
        if cell.cell_type == "code" and name in defined_names(cell.source):
            error = cell_error(cell)
            return (i, error) if error else None
    return None


def note_undefined_name(cells: list[NotebookNode], index: int) -> str | None:
    """If cell `index` failed with a NameError for a name that an earlier cell defines but did
    not finish, append a note to that error saying so; the note, or None."""
    cell = cells[index]
    errors = [o for o in cell.get("outputs", []) if o.get("output_type") == "error"]
    if not errors or errors[-1].get("ename") != "NameError":
        return None
    found = _UNDEFINED.search(errors[-1].get("evalue", ""))
    definer = unfinished_definer(cells, index, found.group(1)) if found else None
    if found is None or not definer:
        return None
    at, (ename, _) = definer
    label = grade_id(cells[at]) or f"cell {at}"
    note = (f"`{found.group(1)}` is defined in cell {label}, which did not finish (it ended "
            f"with {ename}), so it was never defined; fix {label} first, then this test")
    errors[-1]["evalue"] = f"{errors[-1].get('evalue', '')}. Note: {note}."
    errors[-1]["traceback"] = list(errors[-1].get("traceback", [])) + [f"Note: {note}."]
    return note
