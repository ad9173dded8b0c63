"""benchmarks/_table.py, the helpers every benchmark shares (the benchmarks themselves run
with `make bench`, never in the test suite)."""

from __future__ import annotations

import sys

import pytest
import torch
from conftest import ROOT

sys.path.insert(0, str(ROOT / "benchmarks"))
from _table import Table, agree, interleave  # noqa: E402


def test_interleave_warms_up_then_alternates_the_order():
    calls: list[str] = []
    samples = interleave({"a": lambda: calls.append("a"), "b": lambda: calls.append("b")},
                         repeats=3, iters=2)
    assert calls == ["a", "b"] + ["a", "a", "b", "b"] + ["b", "b", "a", "a"] + ["a"] * 2 + ["b"] * 2
    assert {name: len(times) for name, times in samples.items()} == {"a": 3, "b": 3}


def test_agree_measures_relative_difference_and_refuses_unequal_work():
    want = torch.tensor([1.0, -4.0], dtype=torch.float64)
    assert agree([(want + 1e-6, want)]) == pytest.approx(0.25e-6)
    with pytest.raises(AssertionError, match="disagree"):
        agree([(want * 1.001, want)])
    with pytest.raises(AssertionError, match="missing"):
        agree([(None, want)])


def test_table_markdown():
    table = Table("caption", ["x", "y"])
    table.add(1, "2.0")
    assert table.markdown() == "caption\n\n| x | y |\n|---|---|\n| 1 | 2.0 |\n"
