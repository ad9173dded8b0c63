"""Valid answers written another way than solutions/ pass every test of their exercise, visible
and hidden (autograder/valid/, its README): a check never refuses an answer for something it
did right. Each file runs on top of the solutions notebook's answers, as in
tests/test_mistakes.py, through the whole test cell of each check it names."""

from __future__ import annotations

import re
from pathlib import Path

import mistakes
import pytest
from conftest import ROOT
from mistake_tables import BY_MODULE

from parlab.check import reset_outcomes

pytestmark = pytest.mark.usefixtures("no_orphans")
VALID = ROOT / "autograder" / "valid"
ENTRIES = sorted(VALID.glob("*/*.py"))


@pytest.mark.parametrize("path", ENTRIES, ids=[f"{p.parent.name}-{p.stem}" for p in ENTRIES])
def test_a_valid_answer_passes_the_visible_and_hidden_tests(path: Path) -> None:
    table = BY_MODULE[path.parent.name]
    checks = mistakes.entry_value(path, "PASSES")
    assert checks, f"{path.name}: no PASSES = [check, ...]"
    for gid in dict.fromkeys(table.test_cell(c) for c in checks):
        reset_outcomes()  # a fresh kernel
        ns = table.namespace(path.read_text())
        mistakes.hidden(table.module, gid)(ns, 0)  # raises what the learner would read


def test_the_readme_lists_every_valid_answer() -> None:
    listed = set(re.findall(r"`(\w+)\.py`", (VALID / "README.md").read_text()))
    assert listed == {p.stem for p in ENTRIES}, sorted(listed ^ {p.stem for p in ENTRIES})
