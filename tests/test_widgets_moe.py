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


def test_lost_tokens_read_right():
    """'0 tokens lost every expert' read wrong (issue 44.4): none, one and several, for k = 1,
    2 and 3, in the capacity explorer's words."""
    said = {(t, k): widgets_moe._lost(t, k) for t in (0, 1, 5) for k in (1, 2, 3)}
    assert said[0, 1] == "no token lost its expert"
    assert said[0, 2] == "no token lost both its experts"
    assert said[1, 3].startswith("<b>1</b> token lost all 3 of its experts")
    assert said[5, 2].startswith("<b>5</b> tokens lost both their experts")
    even = widgets_moe.describe_capacity(widgets_moe.capacity_summary(2048, 8, 2, 0.0, 2.0))
    assert "no token lost both its experts" in even and "0 tokens" not in even


def _capacity_in_plot(ex) -> int:
    """The capacity the figure's dashed line is labelled with ("capacity 160")."""
    labels = [t.get_text() for t in ex.figure.axes[0].get_legend().get_texts()]
    return int(next(lab for lab in labels if lab.startswith("capacity ")).split()[1])


def test_capacity_text_and_plot_come_from_the_same_settings():
    """The summary once read '⌈1.25 · 2048 · 2 / 64⌉' with top-k at 4, while the plot was
    redrawn (issue 44.4): after every change, text and figure show the controls' values, and
    while it recomputes the old text is greyed under 'updating', not shown as current."""
    ex = widgets_moe.capacity_explorer()
    seen = []
    compute = ex.compute

    def watched(**values):
        seen.append(ex.html.value)
        return compute(**values)

    ex.compute = watched
    for name, value in (("n_tokens", 2048), ("num_experts", 64), ("k", 4),
                        ("capacity_factor", 1.0)):
        ex.controls[name].value = value
        c = ex.summary["stats"].capacity
        v = ex.values()
        assert (f"⌈{v['capacity_factor']:g} · {v['n_tokens']} · {v['k']} / "
                f"{v['num_experts']}⌉ = <b>{c}</b>") in ex.html.value, ex.html.value
        assert _capacity_in_plot(ex) == c and "updating" not in ex.html.value
    assert len(seen) == 4 and all(s.startswith("<i>updating") for s in seen), seen


def test_a2a_shows_the_ep_degree_and_leaves_out_fractional_experts():
    """64 experts on nodes of 4 GPUs: 32 nodes would be 128 ranks for 64 experts (half an
    expert per GPU), offered without a word on an axis in nodes (issue 44.4). Only node counts
    whose EP degree divides E are drawn, the axis and the text name the EP degree, the text
    says which counts were left out and why; an impossible setting is explained, not drawn."""
    s = widgets_moe.a2a_summary(8192, 7168, 8, 64, 4)
    assert sorted(s["rows"]) == [1, 2, 4, 8, 16] and s["left_out"] == [32]
    text = widgets_moe.describe_a2a(s)
    assert "ep = 64, 1 expert per GPU" in text, text
    assert "not shown: 32 nodes (ep = 128 ranks for 64 experts)" in text, text
    ticks = [t.get_text() for t in widgets_moe.plot_a2a(s).axes[0].get_xticklabels()]
    assert ticks == [f"{n}\nep {4 * n}" for n in (1, 2, 4, 8, 16)], ticks
    with pytest.raises(ValueError, match="does not divide the 64 experts"):
        widgets_moe.a2a_cost(8192, 7168, k=8, num_experts=64, nodes=32, gpus_per_node=4)
    ex = widgets_moe.a2a_explorer()
    ex.controls["num_experts"].value, ex.controls["gpus_per_node"].value = 64, 4
    assert max(ex.summary["rows"]) == 16 and "not shown: 32 nodes" in ex.html.value
    with pytest.raises(ValueError, match="whole number of experts per GPU"):
        widgets_moe.a2a_summary(8192, 7168, 2, 6, 4)
