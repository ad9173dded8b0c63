"""parlab.widgets.moe without a browser: hand-derived numbers, controls that recompute, plots.

Capacity: with N = 256 tokens, E = 8, k = 2, the even share is 64 assignments per expert and
c = ceil(phi * 64): 80 at phi = 1.25, 16 at phi = 0.25. An even router (skew 0) over many tokens
drops little at phi = 2; a skewed one drops at phi = 1. The assignments kept never exceed the
capacity. A2A: k = 1 over G nodes leaves (G-1)/G of the tokens crossing nodes either way.
"""

from __future__ import annotations

import ipywidgets as ipw
import matplotlib
import pytest
from matplotlib.figure import Figure

from parlab.widgets import moe as widgets_moe

matplotlib.use("Agg")


def test_capacity_summary_numbers():
    s = widgets_moe.capacity_summary(256, 8, 2, 2.0, 1.25)
    st = s["stats"]
    assert st.capacity == 80 and sum(st.offered) == 512
    assert max(st.kept) <= 80 and sum(st.kept) + st.dropped_assignments == 512
    assert s["phis"][0] == 0.25 and s["dropped_assignments"][0] >= 1 - 8 * 16 / 512
    assert s["dropped_assignments"] == sorted(s["dropped_assignments"], reverse=True)
    even = widgets_moe.capacity_summary(2048, 8, 2, 0.0, 2.0)
    assert even["stats"].dropped_tokens == 0


def test_capacity_explorer_recomputes():
    ex = widgets_moe.capacity_explorer()
    assert isinstance(ex, ipw.VBox) and isinstance(ex.figure, Figure)
    assert "= <b>80</b>" in ex.html.value
    ex.controls["capacity_factor"].value = 2.0
    assert ex.summary["stats"].capacity == 128 and "= <b>128</b>" in ex.html.value


def test_a2a_summary_and_explorer():
    s = widgets_moe.a2a_summary(1000, 100, 1, 64, 8)
    for nodes, row in s["rows"].items():
        assert row["hierarchical"]["inter_bytes"] == pytest.approx(
            row["flat"]["inter_bytes"])  # k = 1: nothing to deduplicate
        assert row["flat"]["inter_bytes"] == pytest.approx(1000 * (nodes - 1) / nodes * 200)
    ex = widgets_moe.a2a_explorer()
    assert isinstance(ex.figure, Figure) and "hierarchical" in ex.html.value
    before = ex.summary["rows"][2]["hierarchical"]["inter_bytes"]
    ex.controls["k"].value = 2
    assert ex.summary["rows"][2]["hierarchical"]["inter_bytes"] < before
