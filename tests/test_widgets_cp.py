"""parlab.widgets.cp without a browser: hand-derived work counts, controls that recompute, plots.

Hand derivations for W = 4, T = 64 (n = 16 tokens per rank, zigzag chunks of m = 8):
contiguous w_r = 256 r + 136 -> [136, 392, 648, 904]; striped w_r = 16 (r + 1) + 4 * 120
-> [496, 512, 528, 544]; zigzag w_r = 7 * 64 + 72 = 520 for every rank; the even share is
T (T + 1) / 2W = 64 * 65 / 8 = 520. The contiguous ring's pace is 136 + 3 * 256 = 904 (every
step after the first waits for a full block); zigzag's is 136 + 3 * 128 = 520.
"""

from __future__ import annotations

import ipywidgets as ipw
import matplotlib
import torch
from matplotlib.figure import Figure

from parlab.widgets import cp as widgets_cp

matplotlib.use("Agg")


def test_summary_by_hand():
    s = widgets_cp.work_summary(4, 64, "zigzag")
    assert s["n"] == 16 and s["block"] == 256 and s["ideal"] == 520
    assert s["per_rank"] == {"contiguous": [136, 392, 648, 904],
                             "striped": [496, 512, 528, 544], "zigzag": [520] * 4}
    assert s["spread"] == {"contiguous": 768, "striped": 48, "zigzag": 0}
    assert s["pace"] == {"contiguous": 904, "striped": 544, "zigzag": 520}
    assert s["steps"] == [[136, 128, 128, 128]] * 4


def test_seq_len_is_rounded_to_a_multiple_of_2w():
    s = widgets_cp.work_summary(3, 64)
    assert s["seq_len"] == 60 and s["requested_seq_len"] == 64 and s["n"] == 20
    assert "rounded down from 64" in widgets_cp.describe_work(s)


def test_explorer_recomputes():
    w = widgets_cp.work_explorer()
    assert isinstance(w, ipw.VBox) and isinstance(w.figure, Figure)
    assert w.summary["per_rank"]["contiguous"] == [136, 392, 648, 904]
    assert "904 (1.74&times; ideal)" in w.html.value  # 904 / 520
    w.controls["world_size"].value = 2  # n = 32: w = [528, 1552]
    assert w.summary["per_rank"]["contiguous"] == [32 * 33 // 2, 1024 + 32 * 33 // 2]
    w.controls["layout"].value = "striped"
    assert w.summary["steps"] == [[528, 496], [528, 528]]  # rank 0 meets rank 1's later keys
    w.controls["seq_len"].value = 8  # n = 4, zigzag m = 2: every rank 3 * 4 + 6 = 18
    assert w.summary["per_rank"]["zigzag"] == [18, 18]


def test_plots_are_labelled():
    fig = widgets_cp.plot_work(widgets_cp.work_summary(4, 64, "contiguous"))
    bars, grid = fig.axes[0], fig.axes[1]
    assert "rank" in bars.get_xlabel() and "entries" in bars.get_ylabel()
    assert "step" in grid.get_xlabel() and "contiguous" in grid.get_title()
    ring = widgets_cp.plot_ring_schedule(3)
    texts = [t.get_text() for t in ring.axes[0].texts]
    assert texts.count("K0 V0") == 3  # every rank holds block 0 once
    measured = {name: {"per_rank": torch.tensor(w), "table": torch.arange(64).reshape(4, 16)}
                for name, w in widgets_cp.work_summary(4, 64)["per_rank"].items()}
    fig = widgets_cp.plot_measured_work(measured)
    assert "Measured" in fig.axes[0].get_title()
