"""parlab.grading.base.startup: a grading process starts without rfc3987_syntax, and nothing it
does needs it (benchmarks/bench_startup.py times the difference)."""

from __future__ import annotations

import importlib.util
import subprocess
import sys

import pytest
from conftest import ROOT

from parlab.grading.base.startup import NBGRADER

CHECK = """
import sys
import parlab.grading, nbformat, jsonschema
assert sys.modules.get("rfc3987_syntax", "absent") is None, "rfc3987_syntax was imported"
nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell("1")])
nbformat.validate(nb)  # notebooks still validate against their schema
bad = nbformat.from_dict({**nb, "cells": [{"cell_type": "code"}]})
try:
    nbformat.validate(bad)
except nbformat.ValidationError:
    print("validated")
"""


def test_grading_starts_without_the_iri_grammar_and_still_validates_notebooks():
    proc = subprocess.run([sys.executable, "-c", CHECK], capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 0 and proc.stdout.strip() == "validated", proc.stderr[-2000:]


def test_jsonschema_imported_first_keeps_its_checker():
    if importlib.util.find_spec("rfc3987_syntax") is None:
        pytest.skip("rfc3987_syntax is not installed here: there is nothing to decline")
    proc = subprocess.run([sys.executable, "-c", "import jsonschema, sys, parlab.grading; "
                           "print(sys.modules['rfc3987_syntax'] is not None)"],
                          capture_output=True, text=True, timeout=120)
    assert proc.stdout.strip() == "True", proc.stderr[-2000:]


def test_nbgrader_command_is_nbgraders_own():
    proc = subprocess.run([*NBGRADER, "--version"], capture_output=True, text=True,
                          cwd=ROOT / "autograder", timeout=120)
    assert proc.returncode == 0 and "nbgrader version" in proc.stdout, proc.stderr[-2000:]
