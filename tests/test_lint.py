"""The code base stays ruff clean and its files stay small (the style guide's ~300 lines)."""

from __future__ import annotations

import ast
import re
import subprocess
import sys
from pathlib import Path

import imports
from conftest import ROOT

MAX_LINES = 320  # "about 300": a little slack, never a thousand-line file


def test_ruff_clean():
    ruff = [sys.executable, "-m", "ruff", "check", "lib", "tests", "benchmarks", "autograder",
            "scripts"]
    proc = subprocess.run(ruff, cwd=ROOT, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_types_check():
    """mypy, basic mode (pyproject's [tool.mypy]), on the whole library."""
    proc = subprocess.run([sys.executable, "-m", "mypy", "lib/parlab"], cwd=ROOT,
                          capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_library_files_are_small():
    long = {str(p.relative_to(ROOT)): n for p in (ROOT / "lib").rglob("*.py")
            if (n := len(p.read_text().splitlines())) > MAX_LINES}
    assert not long, f"split these files (over {MAX_LINES} lines): {long}"


# --- the architecture: no cycles, no lazy shims, reference code never imports the grader ------

GRADER = ("parlab.check", "parlab.grading")


def _is_grader(module: str) -> bool:
    return module.startswith(GRADER)


def test_no_import_cycles():
    found = imports.cycles(imports.import_graph(ROOT / "lib"))
    assert not found, f"import cycles (module-level or inside functions): {found}"


def test_no_module_level_getattr():
    found = imports.module_getattr(ROOT / "lib")
    assert not found, f"module-level __getattr__ (import the names in __init__ instead): {found}"


def test_reference_code_never_imports_checks_or_grading():
    graph = imports.import_graph(ROOT / "lib")
    bad = {m: sorted(t for t in targets if _is_grader(t))
           for m, targets in graph.items() if not _is_grader(m)}
    bad = {m: t for m, t in bad.items() if t}
    assert not bad, f"reference code imports the grader: {bad}"


def test_the_import_reader_sees_what_it_must():
    # the reader itself: a cycle inside functions, a shim and a back-import are all found
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert imports.cycles(graph) == [["a", "b", "c"]]
    assert "parlab.comm" in imports.import_graph(ROOT / "lib")["parlab.check.pp.p2p"]  # in a def


# --- the grader's house: one sub-package per instructor's step, arrows only where allowed -----

GRADING = ROOT / "lib" / "parlab" / "grading"


def _allowed(package: Path) -> set[str]:
    """The parlab.grading sub-packages its docstring's "May import:" paragraph names."""
    doc = ast.get_docstring(ast.parse((package / "__init__.py").read_text())) or ""
    assert "May import:" in doc, f"{package.name}/__init__.py must say what it may import"
    said = doc.split("May import:", 1)[1].split("\n\n", 1)[0]
    return set(re.findall(r"parlab\.grading\.(\w+)", said))


def test_grading_sub_packages_import_only_what_their_docstrings_allow():
    """Each sub-package of parlab.grading (collect, autograde, engines, feedback, report, the
    learner's side, and what they share: base, sandbox, verify) imports the others only as its
    docstring's "May import:" says, and never the package above it (no arrow back up)."""
    graph = imports.import_graph(ROOT / "lib")
    packages = sorted(p for p in GRADING.iterdir() if (p / "__init__.py").exists())
    assert {p.name for p in packages} >= {"base", "collect", "autograde", "engines", "feedback",
                                          "report", "learner", "sandbox", "verify"}
    bad = []
    for package in packages:
        allowed = _allowed(package) | {package.name}
        prefix = f"parlab.grading.{package.name}"
        for module, targets in graph.items():
            if module != prefix and not module.startswith(prefix + "."):
                continue
            for target in targets:
                if target == "parlab.grading":
                    bad.append(f"{module} imports parlab.grading (an arrow back up)")
                elif target.startswith("parlab.grading.") and \
                        target.split(".")[2] not in allowed:
                    bad.append(f"{module} imports {target}")
    assert not bad, "imports that sub-packages' docstrings do not allow:\n" + "\n".join(bad)


def test_the_grading_rule_reader_sees_a_forbidden_arrow(tmp_path):
    package = tmp_path / "collect"
    package.mkdir()
    doc = '"""What it is.\n\nMay import: parlab.grading.base.\n"""\n'
    (package / "__init__.py").write_text(doc)
    assert _allowed(package) == {"base"}
