"""parlab.widgets.pp without a browser: numbers derived by hand, controls that recompute, plots.

Hand derivations (zero latency): 1F1B with p = 4, m = 8 idles 3/11 of the step, 3/8 of the
useful time, holds 4 microbatches on rank 0 (GPipe 8) and sends 2m(p - 1) = 48 messages.
Interleaved, v = 2: 3/19 and 3/16, 2m(pv - 1) = 112 messages. ZB-H1 with t_f = t_b = t_w = 1:
3 units idle per rank in a step of 3m + 3 = 27, against 1F1B's 9 in 33.
"""

from __future__ import annotations

import ipywidgets as ipw
import matplotlib
import pytest
from matplotlib.figure import Figure

from parlab.widgets import pp as widgets_pp

matplotlib.use("Agg")


def test_summary_of_1f1b():
    s = widgets_pp.pipeline_summary("1f1b", 4, 8, 1, 1.0, 2.0, 0.0)
    assert s["bubble"] == pytest.approx(3 / 11) and s["formula"] == pytest.approx(3 / 11)
    assert s["ratio"] == pytest.approx(3 / 8) and s["formula_ratio"] == pytest.approx(3 / 8)
    assert s["peak"] == 4 and s["messages"] == 48 and s["notes"] == []


def test_summary_adjusts_and_says_so():
    s = widgets_pp.pipeline_summary("interleaved_1f1b", 4, 6, 2, 1.0, 2.0, 0.0)
    assert s["m"] == 8 and "multiple of p" in s["notes"][0]
    assert s["bubble"] == pytest.approx(3 / 19) and s["messages"] == 112
    s = widgets_pp.pipeline_summary("gpipe", 4, 8, 3, 1.0, 2.0, 0.0)
    assert s["v"] == 1 and "interleaved 1F1B only" in s["notes"][0]
    assert s["peak"] == 8


def test_summary_of_zb_h1():
    s = widgets_pp.pipeline_summary("zb_h1", 4, 8, 1, 1.0, 1.0, 1.0)
    assert s["bubble"] == pytest.approx(3 / 27)
    assert s["bubble_1f1b"] == pytest.approx(9 / 33)
    assert "1F1B with the same costs: 27.3%" in widgets_pp.describe_pipeline(s)


def test_latency_makes_the_simulation_differ_from_the_formula():
    s = widgets_pp.pipeline_summary("1f1b", 4, 8, 1, 1.0, 2.0, 0.0, latency=0.5)
    assert s["bubble"] > s["formula"]
    assert "simulation differs" in widgets_pp.describe_pipeline(s)


def test_explorer_recomputes_on_every_control():
    w = widgets_pp.pipeline_explorer()
    assert isinstance(w, ipw.VBox) and isinstance(w.figure, Figure)
    assert set(w.controls) == {"schedule", "p", "m", "v", "t_f", "t_b", "t_w", "latency"}
    assert "27.3%" in w.html.value and "37.5%" in w.html.value  # 3/11 and 3/8
    w.controls["schedule"].value = "interleaved_1f1b"
    assert w.summary["bubble"] == pytest.approx(3 / 19) and "15.8%" in w.html.value
    w.controls["m"].value = 16  # 3/(32 + 3)
    assert w.summary["bubble"] == pytest.approx(3 / 35)
    w.controls["p"].value = 2  # 1/(2*16 + 1)
    assert w.summary["bubble"] == pytest.approx(1 / 33)
    w.controls["schedule"].value = "gpipe"
    assert w.summary["peak"] == 16 and "GPipe: 16" in w.html.value
    w.controls["t_b"].value = 1.0
    w.controls["t_w"].value = 1.0
    assert w.summary["result"].makespan == pytest.approx((16 + 1) * 3)  # B costs t_b + t_w


def test_plot_is_labelled():
    fig = widgets_pp.plot_pipeline(widgets_pp.pipeline_summary("1f1b", 4, 8, 1, 1, 2, 0))
    ax = fig.axes[0]
    assert "1F1B" in ax.get_title() and "27.3%" in ax.get_title()
    assert [t.get_text() for t in ax.get_yticklabels()] == [f"rank {r}" for r in range(4)]
    assert any("bubble" in t.get_text() for t in ax.get_legend().get_texts())


def test_slider_labels_fit_their_width():
    # The widgets' font sets about 0.6 em per character (measured in Chromium: a 10 em label
    # showed "t_w (backward, w..." of "t_w (backward, weights)"): every label must fit whole.
    w = widgets_pp.pipeline_explorer()
    for name, control in w.controls.items():
        width = float(control.style.description_width.removesuffix("em"))
        assert 0.6 * len(control.description) <= width, (name, control.description, width)


def test_description_says_whose_form_is_which():
    text = widgets_pp.describe_pipeline(widgets_pp.pipeline_summary("1f1b", 4, 8, 1, 1, 2, 0))
    assert "GPipe's share of the step" in text and "Megatron's ratio to useful time" in text
