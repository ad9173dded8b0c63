"""The memory calculator: numbers from closed forms written here, a figure, a live refresh."""

from __future__ import annotations

import matplotlib

matplotlib.use("Agg")

import pytest  # noqa: E402

from parlab.widgets import (  # noqa: E402
    describe_memory,
    memory_explorer,
    memory_summary,
    plot_memory,
)


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
    w.controls["recompute"].value = "none"
    assert "does <b>not</b> fit" in w.html.value
    w.controls["dp"].value = 32
    w.controls["recompute"].value = "selective"  # 80 x 34 sbh = 91 GB of activations
    assert not w.summary["fits"]["zero3"]
    act = 80 * 34 * 4096 * 8192
    assert w.summary["bars"]["zero3"]["activations"] == pytest.approx(act)


def test_bars_are_linear_and_keep_their_proportions():
    # on a log axis ZeRO-3's 4.4 GB of weights fell below the floor and the optimizer state
    # looked the size of the weights; linear bars are as tall as the parts, in both panels
    s = memory_summary(70, 80, 8192, 4096, 1, "zero3", 32, "H100 80 GB", recompute=True)
    fig = plot_memory(s)
    full, zoom = fig.axes
    for ax in (full, zoom):
        assert ax.get_yscale() == "linear" and ax.get_ylim()[0] == 0
    heights = [p.get_height() for p in full.patches]  # part by part, strategy by strategy
    strategies = list(s["bars"])
    for i, part in enumerate(("weights", "gradients", "optimizer state", "activations")):
        for j, name in enumerate(strategies):
            assert heights[i * len(strategies) + j] == pytest.approx(
                s["bars"][name][part] / 1e9)
    zero3 = {part: s["bars"]["zero3"][part] for part in ("weights", "optimizer state")}
    assert zero3["optimizer state"] == pytest.approx(6 * zero3["weights"])  # 12 B vs 2 B
    assert full.get_ylim()[1] > s["totals"]["ddp"] / 1e9  # every bar whole on the left
    assert zoom.get_ylim()[1] == pytest.approx(1.6 * 80)  # cut just above the GPU on the right
    texts = [t.get_text() for t in zoom.texts]
    assert f"↑{s['totals']['ddp'] / 1e9:,.0f}" in texts  # a cut bar says how tall it is
