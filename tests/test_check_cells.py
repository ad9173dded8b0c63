"""The release's test cells as a learner runs them: a passing check prints its line and
nothing else. A check that returns a value and ends its cell would echo that value as
Out[...] under the message; such a cell assigns it (`measured = check_...(...)`)."""

from __future__ import annotations

import ast
import inspect
from pathlib import Path

import nbformat
import pytest
from conftest import ROOT

from parlab.grading import grade_id
from parlab.grading.verify.source import split_hidden

NOTEBOOKS = sorted((ROOT / "course").glob("*/*.ipynb"))


def _code_lines(source: str) -> list[str]:
    return [ln.split("#")[0].rstrip() for ln in source.splitlines() if ln.split("#")[0].strip()]


def _imports(nb: nbformat.NotebookNode) -> dict:
    namespace: dict = {}
    for cell in nb.cells:
        if "imports" in cell.metadata.get("tags", []):
            exec(compile(cell.source, "<imports>", "exec"), namespace)  # noqa: S102 - ours
    return namespace


@pytest.mark.parametrize("notebook", NOTEBOOKS, ids=[p.parent.name for p in NOTEBOOKS])
def test_a_passing_check_does_not_echo_its_value(notebook: Path) -> None:
    nb = nbformat.read(notebook, as_version=4)
    namespace = None
    echoing = []
    for cell in nb.cells:
        if cell.cell_type != "code" or not grade_id(cell) or "check" not in cell.source:
            continue
        visible = split_hidden(cell.source)[0]
        if _code_lines(visible)[-1:] and _code_lines(visible)[-1].endswith(";"):
            continue  # IPython shows no Out[] for a cell ending with ";"
        body = ast.parse(visible).body
        last = body[-1] if body else None
        if not (isinstance(last, ast.Expr) and isinstance(last.value, ast.Call)):
            continue
        namespace = namespace if namespace is not None else _imports(nb)
        own = ast.Module([n for n in body if isinstance(n, (ast.Import, ast.ImportFrom))], [])
        exec(compile(own, "<the cell's imports>", "exec"), namespace)  # noqa: S102 - ours
        fn = eval(compile(ast.Expression(last.value.func), "<call>", "eval"), namespace)  # noqa: S307
        returns = inspect.signature(fn).return_annotation
        if returns not in (None, "None"):
            echoing.append(f"{grade_id(cell)}: {ast.unparse(last.value.func)} -> {returns}")
    assert not echoing, ("test cells end with a check that returns a value (shown as Out[]): "
                         f"assign it, or make the check return None: {echoing}")
