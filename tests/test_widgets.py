"""parlab.widgets without a browser: build, move controls programmatically, check numbers/plots."""

from __future__ import annotations

import ipywidgets as ipw
import matplotlib
import pytest
from matplotlib.figure import Figure

from parlab import widgets

matplotlib.use("Agg")  # no display: safe after pyplot's import, nothing has been drawn yet

NIC = "400G NIC 50 GB/s"
NVLINK_ONE_WAY = "NVLink 450 GB/s (H100, one direction)"


def test_summary_numbers_by_hand():
    s = widgets.interconnect_summary(8192, 4e6, 1e15, 50e9)
    assert s["required"] == pytest.approx(1e15 / 50e9) == 20_000
    assert s["tp_intensity"] == 8192
    assert s["dp_intensity"] == pytest.approx(3 * 4e6)
    assert s["tp_headroom"] == pytest.approx(8192 / 20_000)
    assert s["dp_headroom"] == pytest.approx(1.2e7 / 2e4)
    assert s["tp_verdict"].startswith("comm-bound: short by 2.4x")
    assert s["dp_verdict"] == "compute-bound with 600x headroom"


def test_explorer_defaults_are_the_worked_nvlink_case():
    w = widgets.interconnect_explorer()
    assert isinstance(w, ipw.VBox)
    assert w.preset in w.children and all(c in w.children for c in w.controls.values())
    assert w.controls["gbps"].value == 900
    assert w.summary["required"] == pytest.approx(1e15 / 900e9)
    assert "TP" in w.html.value and "compute-bound with 7.4x headroom" in w.html.value
    assert isinstance(w.figure, Figure)


def test_preset_moves_slider_and_flips_tp_verdict():
    w = widgets.interconnect_explorer()
    w.preset.value = NIC
    assert w.controls["gbps"].value == 50
    assert w.summary["bytes_per_s"] == pytest.approx(50e9)
    assert w.summary["required"] == pytest.approx(1e15 / 50e9)
    assert "comm-bound: short by 2.4x" in w.html.value
    assert "compute-bound with 600x headroom" in w.html.value  # DP at 4M tokens
    w.preset.value = NVLINK_ONE_WAY  # 1e15 / 450e9 = 2222 FLOP/B needed: 8192 / 2222 = 3.7x
    assert "compute-bound with 3.7x headroom" in w.html.value


def test_sliders_recompute():
    w = widgets.interconnect_explorer(link=NIC)
    w.controls["h"].value = 32768  # wider model: 32768 / 20000 = 1.6x headroom on the NIC
    assert w.summary["tp_intensity"] == 32768
    assert "compute-bound with 1.6x headroom" in w.html.value
    w.controls["tflops"].value = 4000  # 4 PFLOP/s needs 80,000 FLOP/B: 32768 / 80000 = 0.41
    assert w.summary["required"] == pytest.approx(4000e12 / 50e9)
    assert w.summary["tp_headroom"] == pytest.approx(32768 / 80_000)
    w.controls["n_tokens"].value = 1000  # DP 3000 FLOP/B vs 80,000 needed: short by 26.7x
    assert w.summary["dp_intensity"] == pytest.approx(3000)
    assert "short by 27x" in w.summary["dp_verdict"]
    first = w.figure
    w.controls["gbps"].value = 123.0
    assert w.preset.value == widgets.CUSTOM
    assert w.summary["bytes_per_s"] == pytest.approx(123e9)
    assert w.figure is not first  # redrawn


def test_plot_is_labelled_log_bars_with_requirement_line():
    s = widgets.interconnect_summary(8192, 4e6, 1e15, 900e9)
    fig = widgets.plot_interconnect(s)
    (ax,) = fig.axes
    assert ax.get_yscale() == "log"
    assert ax.get_title() and ax.get_xlabel() and ax.get_ylabel()
    assert ax.get_legend() is not None
    fig.canvas.draw()
    labels = [t.get_text() for t in ax.get_xticklabels()]
    assert labels[0].startswith("TP") and labels[1].startswith("DP")
    assert [p.get_height() for p in ax.patches] == pytest.approx([8192, 3 * 4e6])
    (line,) = ax.get_lines()
    assert line.get_ydata()[0] == pytest.approx(1e15 / 900e9)


def test_plot_draws_on_given_axes():
    import matplotlib.pyplot as plt

    fig, (left, right) = plt.subplots(1, 2)
    out = widgets.plot_interconnect(widgets.interconnect_summary(1024, 1e5, 1e15, 12.5e9), right)
    assert out is fig and len(right.patches) == 2 and not left.patches
    plt.close(fig)


def test_explorer_is_reusable_for_other_widgets():
    calls = []

    def compute(x: int) -> dict:
        calls.append(x)
        return {"square": x * x}

    def plot(summary, ax=None):
        import matplotlib.pyplot as plt

        fig, ax = plt.subplots()
        ax.bar(["x²"], [summary["square"]])
        return fig

    slider = ipw.IntSlider(value=3)
    w = widgets.Explorer({"x": slider}, compute, lambda s: f"x² = {s['square']}", plot)
    assert w.html.value == "x² = 9"
    slider.value = 5
    assert w.summary == {"square": 25} and w.html.value == "x² = 25" and calls == [3, 5]


def _fits(dropdown: ipw.Dropdown) -> str | None:
    """Why a dropdown's longest label would be cut, or None: the select gets the control's
    width less its description's (both in em), and needs about 0.6em a character plus 2em
    for its arrow (proportional fonts: digits 0.55em, capitals up to 0.7em)."""
    width, described = dropdown.layout.width, dropdown.style.description_width
    if not (width and width.endswith("em") and described.endswith("em")):
        return f"{dropdown.description!r}: width {width!r}, description {described!r}"
    room = float(width[:-2]) - float(described[:-2])
    longest = max((str(label) for label in dropdown.options), key=len)
    need = 0.6 * len(longest) + 2
    return None if need <= room else f"{longest!r} needs {need:.1f}em, the select has {room:g}em"


def test_link_presets_read_whole():
    """The link dropdown of modules 00 and 02 is as wide as the sliders, so its longest label
    ("NVLink 900 GB/s (H100, both directions)") is not cut (issue 44.4: it read
    "NVLink 900 GB/s (H10")."""
    for explorer in (widgets.interconnect_explorer(), widgets.tp_comm_explorer()):
        assert _fits(explorer.preset) is None, _fits(explorer.preset)
