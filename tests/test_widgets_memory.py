"""The memory calculator: numbers from closed forms written here, a figure, a live refresh."""

from __future__ import annotations

import matplotlib

matplotlib.use("Agg")

import pytest  # noqa: E402

from parlab.widgets import describe_memory, memory_explorer, memory_summary  # noqa: E402


def test_practice_problem_numbers():
    s = memory_summary(70, 80, 8192, 4096, 1, "zero3", 32, "H100 80 GB", recompute=True)
    act = 80 * 2 * 4096 * 8192 + 4096 * 8192 * (34 + 5 * 64 * 4096 / 8192)
    assert s["bars"]["zero3"]["optimizer state"] == pytest.approx(12 * 70e9 / 32)
    assert s["bars"]["ddp"]["weights"] == pytest.approx(2 * 70e9)
    assert s["totals"]["zero3"] == pytest.approx(16 * 70e9 / 32 + act)
    assert s["fits"]["zero3"] and not s["fits"]["ddp"] and not s["fits"]["zero1"]
    assert "fits" in describe_memory(s)


def test_explorer_redraws_on_change():
    w = memory_explorer()
    before = w.summary["totals"]["zero3"]
    w.controls["dp"].value = 8
    assert w.summary["totals"]["zero3"] > before
    ax = w.figure.axes[0]
    assert ax.get_ylabel() and ax.get_title() and ax.get_legend() is not None
    w.controls["recompute"].value = False
    assert "does <b>not</b> fit" in w.html.value
