"""parlab.widgets.tp without a browser: hand-derived numbers, controls that recompute, plots.

Hand derivations for the course's practice problem 2 (b = 1, s = h = 8192, t = 8, bf16):
bsh = 2^26 elements = 2^27 B = 128 MiB; per layer 4 * 2 * 7/8 * 2^27 B = 7 * 2^27 B = 896 MiB,
so 7 * 2^27 / 900e9 s over NVLink and 7 * 2^27 / 50e9 s over a 400G NIC. Compute per layer:
3 (24 + 4) 8192^3 FLOPs = 84 * 2^39, over t = 8 ranks at 1e15 FLOP/s when a test says so,
at an H100's dense bf16 peak (parlab.costs.H100_BF16_FLOPS) by default.
"""

from __future__ import annotations

import ipywidgets as ipw
import matplotlib
import pytest
from matplotlib.figure import Figure

from parlab import costs
from parlab.widgets import tp as widgets_tp

matplotlib.use("Agg")

NIC = "400G NIC 50 GB/s"
PER_LAYER = 7 * 2**27  # bytes each rank sends per layer at the practice problem's sizes
AT_1000 = 84 * 2**39 / 8 / 1e15  # seconds per layer and rank at 1000 TFLOP/s
COMPUTE = 84 * 2**39 / 8 / costs.H100_BF16_FLOPS  # the same at the widgets' default


def test_layer_flops_by_hand():
    assert widgets_tp.layer_flops(1, 8192, 8192) == 84 * 2**39
    assert widgets_tp.layer_flops(2, 4, 3) == 3 * (24 * 2 * 4 * 9 + 4 * 2 * 16 * 3)


def test_summary_of_the_practice_problem():
    s = widgets_tp.tp_comm_summary(1, 8192, 8192, 8, gbps=900, tflops=1000)
    assert s["sent"] == PER_LAYER and s["sent"] / 2**20 == 896
    assert s["comm"] == pytest.approx(PER_LAYER / 900e9)  # 1.04 ms
    assert s["compute"] == pytest.approx(AT_1000)  # 5.77 ms
    assert s["ratio"] == pytest.approx(PER_LAYER / 900e9 / AT_1000)
    assert s["exposed_share"] == pytest.approx(s["comm"] / (s["comm"] + s["compute"]))
    assert s["ts"] == [1, 2, 4, 8, 16, 32, 64]
    assert s["bytes"][0] == 0 and s["comm_s"][0] == 0  # t = 1: nobody to talk to
    assert s["bytes"][1] == pytest.approx(4 * 2 * 0.5 * 2**27)  # t = 2
    assert s["compute_s"][-1] == pytest.approx(84 * 2**39 / 64 / 1e15)
    assert set(s["others"]) == {k for k in widgets_tp.LINK_PRESETS_GBPS if "900" not in k}
    assert s["others"][NIC][3] == pytest.approx(PER_LAYER / 50e9)  # t = 8 on the NIC


def test_fp32_doubles_the_bytes():
    bf16 = widgets_tp.tp_comm_summary(1, 1024, 1024, 4, gbps=100, tflops=100)
    fp32 = widgets_tp.tp_comm_summary(1, 1024, 1024, 4, gbps=100, tflops=100, dtype_bytes=4)
    assert fp32["sent"] == 2 * bf16["sent"] and fp32["compute"] == bf16["compute"]


def test_explorer_defaults_and_preset():
    w = widgets_tp.tp_comm_explorer()
    assert isinstance(w, ipw.VBox) and isinstance(w.figure, Figure)
    assert w.summary["t"] == 8 and w.summary["gbps"] == 900
    assert "896 MiB" in w.html.value and "1.04 ms" in w.html.value
    assert f"{COMPUTE * 1e3:.2f} ms" in w.html.value  # 5.83 ms
    assert "0.18x as long as compute" in w.html.value
    assert "exposed <b>15%</b>" in w.html.value  # 1.04 / (1.04 + 5.83)
    w.preset.value = NIC
    assert w.controls["gbps"].value == 50
    assert w.summary["comm"] == pytest.approx(PER_LAYER / 50e9)
    assert "18.8 ms" in w.html.value and "the link, not the GPU" in w.html.value


def test_sliders_recompute():
    w = widgets_tp.tp_comm_explorer()
    w.controls["t"].value = 2  # 4 * 2 * 1/2 * 2^27 B = 2^29 B = 512 MiB, compute 4x longer
    assert w.summary["sent"] == 2**29 and "512 MiB" in w.html.value
    assert w.summary["compute"] == pytest.approx(4 * COMPUTE)
    w.controls["b"].value = 4  # bytes and compute both scale with b
    assert w.summary["sent"] == 4 * 2**29
    assert w.summary["compute"] == pytest.approx(16 * COMPUTE)
    w.controls["dtype_bytes"].value = 4
    assert w.summary["sent"] == 8 * 2**29
    w.controls["gbps"].value = 123.0
    assert w.preset.value == widgets_tp.CUSTOM


def test_plots_are_labelled():
    fig = widgets_tp.plot_tp_comm(widgets_tp.tp_comm_summary(1, 8192, 8192, 8, 50, 1000))
    ax = fig.axes[0]
    assert "tensor-parallel size t" in ax.get_xlabel() and "ms" in ax.get_ylabel()
    labels = [t.get_text() for t in ax.get_legend().get_texts()]
    assert any("50 GB/s" in s for s in labels) and any("compute" in s for s in labels)
    diagram = widgets_tp.plot_mlp_sharding(4)
    texts = {t.get_text() for t in diagram.axes[0].texts}
    assert {"A1", "A4", "B1", "B4"} <= texts and "t = 4" in diagram.axes[0].get_title()


def test_cost_table_of_the_practice_problem():
    text = widgets_tp.tp_cost_table(1, 8192, 8192, 8)
    assert "| 128 MiB (134,217,728 B) |" in text  # 2^26 elements x 2 B
    assert "| 224 MiB |" in text  # 2 * 7/8 * 128 MiB
    assert "| 896 MiB |" in text and f"| {COMPUTE * 1e3:.2f} ms |" in text  # 5.83 ms
    comm = PER_LAYER / 450e9  # per direction: 2.09 ms, exposed share comm / (comm + compute)
    row = next(ln for ln in text.splitlines() if ln.startswith("| NVLink 450"))
    assert "2.09 ms" in row and f"{comm / COMPUTE:.2f}" in row
    assert f"{comm / (comm + COMPUTE):.0%}" == "26%" and "| 26% |" in row  # 2.09 / 7.92
    nic = next(ln for ln in text.splitlines() if ln.startswith("| 400G NIC"))
    assert "18.8 ms" in nic and f"{PER_LAYER / 50e9 / COMPUTE:.2f}" in nic and "76%" in nic


def test_layer_flops_is_the_gemm_count_plus_attention():
    b, s, h = 2, 6, 10  # 2mkn per GEMM; forward: QKV, proj, fc1, fc2, QK^T, AV; backward 2x
    forward = (2 * b * s * h * 3 * h + 2 * b * s * h * h + 2 * b * s * h * 4 * h
               + 2 * b * s * 4 * h * h + 2 * b * s * s * h + 2 * b * s * s * h)
    assert widgets_tp.layer_flops(b, s, h) == 3 * forward
    assert 3 * 24 * b * s * h * h == 72 * b * s * h * h  # module 00's 72BSH^2 is the GEMM part
