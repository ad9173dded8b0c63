"""The import graph of lib/parlab, read from the source (module level and inside functions).

Used by tests/test_lint.py: every `import` and `from ... import` statement anywhere in a module,
resolved to the parlab modules it runs. `from parlab.pp import simulate` runs the package
`parlab.pp` (its __init__); `from parlab.pp import simulator` names the submodule
`parlab.pp.simulator`; relative imports are resolved against the importing module.
"""

from __future__ import annotations

import ast
from pathlib import Path


def module_name(path: Path, lib: Path) -> str:
    parts = list(path.relative_to(lib).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def library_modules(lib: Path) -> dict[str, Path]:
    return {module_name(p, lib): p for p in (lib / "parlab").rglob("*.py")}


def _targets(node: ast.AST, here: str, is_package: bool, modules: dict[str, Path]) -> set[str]:
    found: set[str] = set()
    if isinstance(node, ast.Import):
        for alias in node.names:
            if alias.name.startswith("parlab"):
                found.add(alias.name)
    elif isinstance(node, ast.ImportFrom):
        base = node.module or ""
        if node.level:
            parts = here.split(".") if is_package else here.split(".")[:-1]
            parts = parts[:len(parts) - node.level + 1]
            base = ".".join(parts + ([base] if base else []))
        if not base.startswith("parlab"):
            return found
        for alias in node.names:
            sub = f"{base}.{alias.name}"
            found.add(sub if sub in modules else base)
    return {t for t in found if t in modules}


def import_graph(lib: Path) -> dict[str, set[str]]:
    """parlab module -> the parlab modules its import statements run."""
    modules = library_modules(lib)
    graph: dict[str, set[str]] = {}
    for name, path in modules.items():
        tree = ast.parse(path.read_text())
        edges: set[str] = set()
        for node in ast.walk(tree):
            edges |= _targets(node, name, path.name == "__init__.py", modules)
        graph[name] = edges - {name}
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    out: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def module_getattr(lib: Path) -> list[str]:
    """Modules that define a module-level __getattr__ (a lazy re-export shim)."""
    found = []
    for name, path in library_modules(lib).items():
        tree = ast.parse(path.read_text())
        if any(isinstance(n, ast.FunctionDef) and n.name == "__getattr__" for n in tree.body):
            found.append(name)
    return sorted(found)
