"""parlab.widgets.sp without a browser: hand-derived numbers, controls that recompute, plots.

Hand derivations for the widget's default, a GPT-3 175B layer (b = 1, s = 2048, h = 12288,
a = 96, t = 8): sbh = 2048 * 12288 = 3 * 2^23 B per "sbh" (fp16 counted in the coefficients),
5as/h = 5 * 96 * 2048 / 12288 = 80. One device: (34 + 80) sbh = 114 sbh = 2,736 MiB; TP:
(10 + 24/8 + 80/8) sbh = 23 sbh = 552 MiB, of which 10 sbh = 240 MiB replicated; TP + SP:
114/8 sbh = 342 MiB. With the scores recomputed: 34 sbh, 13 sbh, 4.25 sbh.
"""

from __future__ import annotations

import ipywidgets as ipw
import matplotlib
import pytest
from matplotlib.figure import Figure

from parlab.widgets import sp as widgets_sp

matplotlib.use("Agg")

SBH = 3 * 2**23  # bytes of one sbh at s = 2048, h = 12288, b = 1
MIB = 2**20


def test_summary_of_the_gpt3_layer():
    s = widgets_sp.activation_summary(1, 2048, 12288, 96, 8)
    one, tp, sp = s["settings"]
    assert s["totals"][one] == 114 * SBH and 114 * SBH / MIB == 2736
    assert s["totals"][tp] == 23 * SBH and s["replicated"][tp] == 10 * SBH
    assert s["totals"][sp] == pytest.approx(114 * SBH / 8) and s["replicated"][sp] == 10 * SBH / 8
    assert s["ratio"] == pytest.approx(23 / (114 / 8))
    assert s["saving"] == pytest.approx((23 - 114 / 8) * SBH)
    assert s["ts"] == [1, 2, 4, 8, 16]
    assert s["tp_by_t"][0] == s["sp_by_t"][0] == 114 * SBH  # t = 1: nothing to split
    assert s["tp_by_t"][4] == pytest.approx((10 + 24 / 16 + 80 / 16) * SBH)


def test_recomputed_scores_drop_the_5as2b_term():
    s = widgets_sp.activation_summary(1, 2048, 12288, 96, 8, recompute_scores=True)
    one, tp, sp = s["settings"]
    assert s["totals"][one] == 34 * SBH and s["totals"][tp] == 13 * SBH
    assert s["totals"][sp] == pytest.approx(34 * SBH / 8)
    assert s["breakdown"][tp][widgets_sp.SCORES] == 0


def test_explorer_defaults_and_controls():
    w = widgets_sp.activation_explorer()
    assert isinstance(w, ipw.VBox) and isinstance(w.figure, Figure)
    assert "2.67 GiB" in w.html.value and "552.0 MiB" in w.html.value  # 2736 MiB = 2.67 GiB
    assert "342.0 MiB" in w.html.value and "240.0 MiB (43%)" in w.html.value
    w.controls["t"].value = 2  # TP: (10 + 12 + 40) sbh = 62 sbh; TP + SP: 57 sbh
    assert w.summary["totals"][w.summary["settings"][1]] == 62 * SBH
    assert w.summary["totals"][w.summary["settings"][2]] == 57 * SBH
    w.controls["b"].value = 4  # every region scales with b
    assert w.summary["totals"][w.summary["settings"][1]] == 4 * 62 * SBH
    w.controls["recompute_scores"].value = True
    assert "recomputed" in w.html.value
    assert w.summary["totals"][w.summary["settings"][2]] == pytest.approx(4 * 34 * SBH / 2)


def test_plots_are_labelled():
    fig = widgets_sp.plot_activations(widgets_sp.activation_summary(1, 2048, 12288, 96, 8))
    left, right = fig.axes
    assert "MiB" in left.get_ylabel() and "tensor-parallel size t" in right.get_xlabel()
    labels = [t.get_text() for t in left.get_legend().get_texts()]
    assert "LayerNorm inputs" in labels and "MLP GeLU and fc2 inputs (TP splits it)" in labels
    assert {t.get_text() for t in right.get_legend().get_texts()} >= {"TP", "TP + SP"}
    layout = widgets_sp.plot_sp_layout(4)
    texts = {t.get_text() for t in layout.axes[0].texts}
    assert {"TP", "TP + SP", "all-gather", "reduce-scatter", "g (all-reduce)"} <= texts
    assert "t = 4" in layout.axes[0].get_title()


def test_activation_table_of_the_gpt3_layer():
    text = widgets_sp.activation_table(1, 2048, 12288, 96, 8)
    per_layer = next(ln for ln in text.splitlines() if ln.startswith("| **per layer**"))
    assert per_layer == "| **per layer** | **2,736 MiB** | **552 MiB** | **342 MiB** |"
    ln_row = next(ln for ln in text.splitlines() if ln.startswith("| LayerNorm inputs"))
    assert ln_row == f"| LayerNorm inputs | {4 * 24:,} MiB | 96 MiB | 12 MiB |"  # 4 sbh = 96 MiB
    assert "240 MiB of the 552 MiB per layer (43%)" in text  # 10 sbh of 23 sbh


def test_bytes_table_puts_the_measurement_beside_the_closed_forms():
    measured = {"b": 2, "s": 12, "h": 48, "t": 2, "sp": {"all_gather": 100, "reduce_scatter": 200},
                "tp": 300}
    text = widgets_sp.sp_bytes_table(measured, 1, 8192, 8192, 8)
    rows = text.splitlines()
    assert "| TP + SP, all-gathers | 100 B | 448 MiB |" in rows  # 4 * 7/8 * 128 MiB
    assert "| **TP + SP, in all** | **300 B** | **896 MiB** |" in rows
    assert "| **plain TP, all-reduces** | **300 B** | **896 MiB** |" in rows
    again = widgets_sp.sp_bytes_table(measured, 1, 8192, 8192, 8,
                                      regathered={"all_gather": 150, "reduce_scatter": 200})
    # Megatron's: 6 all-gathers of 7/8 x 128 MiB, 10 collectives in all
    assert ("| Megatron's TP + SP (inputs gathered again in backward), all-gathers | 150 B "
            "| 672 MiB |") in again.splitlines()
    assert "| **Megatron's TP + SP, in all** | **350 B** | **1,120 MiB** |" in again.splitlines()


def test_layer_memory_table_ratios_and_totals():
    text = widgets_sp.layer_memory_table({"LayerNorm": 800, "MLP": 300}, {"LayerNorm": 400,
                                          "MLP": 300}, yours=700, sizes="float32")
    rows = text.splitlines()
    assert "| LayerNorm | 800 B | 400 B | 2 |" in rows and "| MLP | 300 B | 300 B | 1 |" in rows
    assert "| **whole layer** | **1,100 B** | **700 B** | 1.57 |" in rows
    assert "**700 B**" in text.split("\n\n")[1] and "(the reference TP + SP layer: 700 B)" in text
    again = widgets_sp.layer_memory_table({"LayerNorm": 800, "MLP": 300}, {"LayerNorm": 400,
                                           "MLP": 300}, yours=700, sizes="float32",
                                          regathered={"LayerNorm": 400, "MLP": 150})
    assert "| LayerNorm | 800 B | 400 B | 2 | 400 B |" in again.splitlines()
    assert "| **whole layer** | **1,100 B** | **700 B** | 1.57 | **550 B** |" in again.splitlines()
