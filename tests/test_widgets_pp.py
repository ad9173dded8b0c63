"""parlab.widgets.pp without a browser: numbers derived by hand, controls that recompute, plots.

Hand derivations (zero latency): 1F1B with p = 4, m = 8 idles 3/11 of the step, 3/8 of the
useful time, holds 4 microbatches on rank 0 (GPipe 8) and sends 2m(p - 1) = 48 messages.
Interleaved, v = 2: 3/19 and 3/16, 2m(pv - 1) = 112 messages. ZB-H1 with t_f = t_b = t_w = 1:
3 units idle per rank in a step of 3m + 3 = 27, against 1F1B's 9 in 33.
DualPipe-V, p = 4, m = 8, t_f = t_b = t_w = 2 per share (a chunk's F = B_in = W = 1): pairs
with no overlap cost F + B = 3, so DualPipe's bubble is (p - 1)(3 + 2 - 3) = 6, the last
rank's idle; with overlap 1 the pair hides its shorter half (t_fb = 6 - 2 = 4, a chunk pair
2): (p - 1)(2 + 2 - 3) = 3. Messages: 2m(2p - 1) stage boundaries less the 2m that stay on
rank p - 1, 4m(p - 1) = 96. Peak: 2p + 1 = 9 chunks, 4.5 in units of a rank's share.
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
    assert set(w.controls) == {"schedule", "p", "m", "v", "t_f", "t_b", "t_w", "latency",
                               "overlap", "compare"}
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


def test_summary_of_dualpipe_v():
    s = widgets_pp.pipeline_summary("dualpipe_v", 4, 8, 2, 2.0, 2.0, 2.0)
    assert s["published"] == pytest.approx(6) and s["idle_last"] == pytest.approx(6)
    assert s["messages"] == 96 and s["peak"] == 4.5 and s["notes"] == []
    hidden = widgets_pp.pipeline_summary("dualpipe_v", 4, 8, 2, 2.0, 2.0, 2.0, overlap=1.0)
    assert hidden["t_fb"] == 4 and hidden["published"] == pytest.approx(3)
    assert hidden["idle_last"] == pytest.approx(3)
    text = widgets_pp.describe_pipeline(hidden)
    assert "published bubble" in text and "exact when t_f = t_b = t_w" in text
    few = widgets_pp.pipeline_summary("dualpipe_v", 4, 6, 1, 1.0, 2.0, 0.0)
    assert few["m"] == 8 and any("m >= 2p" in n for n in few["notes"])
    assert any("two chunks" in n for n in few["notes"])
    assert "only when t_f = t_b = t_w" in widgets_pp.describe_pipeline(few)


def test_compare_draws_four_schedules_on_one_time_axis():
    s = widgets_pp.pipeline_summary("dualpipe_v", 3, 6, 2, 2.0, 2.0, 2.0, compare=True)
    assert list(s["compared"]) == ["1f1b", "zb_h1", "interleaved_1f1b", "dualpipe_v"]
    assert s["compared"]["1f1b"].idle[0] == pytest.approx(6 * 2)  # (p - 1)(t_f + t_b + t_w)
    assert s["compared"]["zb_h1"].idle[0] == pytest.approx(2 * 2)  # (p - 1)(t_f + t_b - t_w)
    assert s["compared"]["dualpipe_v"].idle[-1] == pytest.approx(2 * 2)  # published, no gain
    fig = widgets_pp.plot_pipeline(s)
    titles = [ax.get_title() for ax in fig.axes]
    assert len(titles) == 4 and titles[3].startswith("DualPipe-V")
    assert len({ax.get_xlim() for ax in fig.axes}) == 1  # one time axis
    assert "compared" in widgets_pp.describe_pipeline(s)
    w = widgets_pp.pipeline_explorer(schedule="dualpipe_v", compare=True)
    assert len(w.figure.axes) == 4
    w.controls["compare"].value = False
    assert len(w.figure.axes) == 1 and "DualPipe-V" in w.figure.axes[0].get_title()
