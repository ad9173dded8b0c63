"""benchmarks/_table.py and _memory.py, the helpers every benchmark shares (the benchmarks
themselves run with `make bench`, never in the test suite)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
import torch
from conftest import ROOT

sys.path.insert(0, str(ROOT / "benchmarks"))
from _memory import mib  # noqa: E402
from _table import Table, agree, interleave, unwatched  # noqa: E402


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


# --- benchmarks/_memory.py: peak RSS ----------------------------------------------------------

MIB = 2**20
PEAKS = """
import json, sys, torch
sys.path.insert(0, sys.argv[1])
from _memory import peak_above

def holds(mib):  # holds mib MiB of float32 at once (two halves, both written), then frees
    def call():
        a, b = torch.ones(mib * 2**20 // 8), torch.ones(mib * 2**20 // 8)
        return float(a[-1] + b[-1])
    return call

first = peak_above(holds(32))
holds(64)()  # memory an earlier, larger call freed must not hide the next call's
second = peak_above(holds(16))
kept = torch.ones(16 * 2**20 // 4)  # held before the call: in the baseline, not counted
third = peak_above(lambda: float(kept.sum()))
print(json.dumps([first, second, third]))
"""


def test_peak_above_measures_what_a_call_holds_at_once():
    # in a process of its own: peak_above changes glibc's malloc settings for the rest of it
    out = subprocess.run([sys.executable, "-c", PEAKS, str(ROOT / "benchmarks")], check=True,
                         capture_output=True, text=True).stdout
    first, second, third = json.loads(out.splitlines()[-1])
    assert abs(first - 32 * MIB) < 2 * MIB
    assert abs(second - 16 * MIB) < 2 * MIB
    assert third < 2 * MIB


CHILDREN = """
import json, subprocess, sys
sys.path.insert(0, sys.argv[1])
from _memory import children_peak_rss

def run(code):
    return lambda: subprocess.run([sys.executable, "-c", code], check=True).returncode

print(json.dumps([children_peak_rss(run("x = b'x' * (48 * 2**20)")),
                  children_peak_rss(run("pass"))]))
"""


def test_children_peak_rss_is_the_largest_process_the_call_waited_for():
    # in a small process of its own: a child's peak starts at the RSS of the process that
    # forked it (Linux's ru_maxrss), so inside pytest it would be pytest's
    out = subprocess.run([sys.executable, "-c", CHILDREN, str(ROOT / "benchmarks")], check=True,
                         capture_output=True, text=True).stdout
    (result, peak), (_, without) = json.loads(out.splitlines()[-1])
    assert result == 0
    assert 40 * MIB < peak - without < 56 * MIB  # the child's 48 MiB string
    assert mib(3 * MIB / 2) == "1.5"


def test_unwatched_pauses_the_comm_listeners_and_restores_them():
    from parlab.comm import tracer as comm

    heard: list[str] = []

    def listener(phase: str, event: object) -> None:
        heard.append(phase)

    comm.add_listener(listener)
    try:
        with unwatched():
            assert listener not in comm._listeners
        assert listener in comm._listeners
        with pytest.raises(RuntimeError), unwatched():
            raise RuntimeError("a failing block gives them back too")
        assert listener in comm._listeners
    finally:
        comm.remove_listener(listener)
