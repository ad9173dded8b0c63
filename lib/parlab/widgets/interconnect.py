"""Module 00 widget: is a strategy compute-bound on this link? FLOPs per byte against the link."""

from __future__ import annotations

import ipywidgets as widgets
import matplotlib.pyplot as plt
from matplotlib.axes import Axes
from matplotlib.figure import Figure

from parlab import costs
from parlab.widgets.explorer import Explorer, Summary, log_slider

LINK_PRESETS_GBPS = {
    "NVLink 900 GB/s (H100, both directions)": costs.NVLINK_BIDIR_BYTES_PER_S / 1e9,
    "NVLink 450 GB/s (H100, one direction)": costs.NVLINK_PER_DIRECTION_BYTES_PER_S / 1e9,
    "400G NIC 50 GB/s": costs.NIC_400G_BYTES_PER_S / 1e9,
    "100G Ethernet 12.5 GB/s": costs.ETHERNET_100G_BYTES_PER_S / 1e9,
}
CUSTOM = "custom (slider)"
# the controls are 36em wide, 10em of it the description: the dropdown shows the rest, wide
# enough for the longest preset whole (about 0.6em a character, 2em for the arrow)
WIDTH, DESCRIPTION_WIDTH = "36em", "10em"


def link_preset_dropdown(link: str) -> widgets.Dropdown:
    """The link presets (and "custom") as a dropdown as wide as the sliders, so that a label
    such as "NVLink 900 GB/s (H100, both directions)" reads whole."""
    return widgets.Dropdown(options=[*LINK_PRESETS_GBPS, CUSTOM], value=link,
                            description="link preset",
                            style={"description_width": DESCRIPTION_WIDTH},
                            layout=widgets.Layout(width=WIDTH))


def interconnect_summary(h: float, n_tokens: float, flops: float, bandwidth: float) -> Summary:
    """FLOPs per byte of TP (~H) and DP (3 N_tok) against what the link needs.

    flops in FLOP/s, bandwidth in bytes/s (SI). Returns intensities, required FLOPs/byte,
    headrooms and one verdict string per strategy (see parlab.costs.comm_verdict).
    """
    tp, dp = costs.tp_flops_per_byte(h), costs.dp_flops_per_byte(n_tokens)
    return {
        "h": h, "n_tokens": n_tokens, "flops_per_s": flops, "bytes_per_s": bandwidth,
        "required": costs.required_flops_per_byte(flops, bandwidth),
        "tp_intensity": tp, "dp_intensity": dp,
        "tp_headroom": costs.headroom(tp, flops, bandwidth),
        "dp_headroom": costs.headroom(dp, flops, bandwidth),
        "tp_verdict": costs.comm_verdict(tp, flops, bandwidth),
        "dp_verdict": costs.comm_verdict(dp, flops, bandwidth),
    }


def describe_interconnect(summary: Summary) -> str:
    return (f"Link needs <b>{summary['required']:,.0f}</b> FLOP/byte "
            f"({summary['flops_per_s'] / 1e12:,.0f} TFLOP/s over "
            f"{summary['bytes_per_s'] / 1e9:,.4g} GB/s)<br>"
            f"<b>TP</b> (&asymp; H = {summary['tp_intensity']:,.0f} FLOP/B): "
            f"{summary['tp_verdict']}<br>"
            f"<b>DP</b> (3&middot;N<sub>tok</sub> = {summary['dp_intensity']:,.3g} FLOP/B): "
            f"{summary['dp_verdict']}")


def plot_interconnect(summary: Summary, ax: Axes | None = None) -> Figure:
    """Bars of FLOPs/byte for TP and DP on a log axis, with the link's requirement as a line."""
    if ax is None:
        fig, ax = plt.subplots(figsize=(6.4, 3.8), layout="constrained")
    else:
        root = ax.figure
        fig = root if isinstance(root, Figure) else root.get_figure(root=True)
    need = summary["required"]
    values = [summary["tp_intensity"], summary["dp_intensity"]]
    ratios = [summary["tp_headroom"], summary["dp_headroom"]]
    colours = ["tab:green" if r >= 1 else "tab:red" for r in ratios]
    bars = ax.bar(["TP (≈ H)", "DP (3·N_tok)"], values, color=colours,
                  label="offered (green: compute-bound, red: comm-bound)")
    ax.axhline(need, color="black", linestyle="--", label=f"link needs {need:,.0f} FLOP/B")
    for bar, ratio in zip(bars, ratios, strict=True):
        top = (bar.get_x() + bar.get_width() / 2, bar.get_height())
        ax.annotate(costs.format_times(ratio), top, ha="center", va="bottom", xytext=(0, 2),
                    textcoords="offset points")
    ax.set_yscale("log")
    ax.set_ylim(min(*values, need) / 10, max(*values, need) * 20)
    ax.set_xlabel("strategy")
    ax.set_ylabel("FLOPs per byte communicated")
    ax.set_title(f"Compute-bound? {summary['flops_per_s'] / 1e12:,.0f} TFLOP/s over "
                 f"{summary['bytes_per_s'] / 1e9:,.4g} GB/s")
    ax.legend(loc="upper left", fontsize="small")
    return fig


def interconnect_explorer(h: int = 8192, n_tokens: float = 4e6, tflops: float = 1000.0,
                          link: str = next(iter(LINK_PRESETS_GBPS))) -> Explorer:
    """Sliders for H, N_tok, TFLOP/s and GB/s, a link preset dropdown, verdicts and a plot.

    Controls (keys of `.controls`): "h", "n_tokens", "tflops", "gbps"; the dropdown is
    `.preset`. Picking a preset moves the GB/s slider; moving the slider off a preset shows
    "custom".
    """
    gbps = widgets.FloatLogSlider(value=LINK_PRESETS_GBPS[link], base=10, min=0, max=3.5,
                                  step=0.01, description="link GB/s", readout_format=",.4g",
                                  continuous_update=False, style={"description_width": "10em"},
                                  layout=widgets.Layout(width="36em"))
    preset = link_preset_dropdown(link)

    def preset_to_slider(change: dict) -> None:
        if change["new"] in LINK_PRESETS_GBPS:
            gbps.value = LINK_PRESETS_GBPS[change["new"]]

    def slider_to_preset(change: dict) -> None:
        match = [k for k, v in LINK_PRESETS_GBPS.items() if abs(v - change["new"]) < 1e-9]
        preset.value = match[0] if match else CUSTOM

    preset.observe(preset_to_slider, names="value")
    gbps.observe(slider_to_preset, names="value")
    controls = {
        "h": log_slider("hidden size H", h, 2, 9, 17, 1, ",.0f"),
        "n_tokens": log_slider("tokens / step", n_tokens, 10, 3, 8, 0.1, ".3s"),
        "tflops": log_slider("TFLOP/s", tflops, 10, 0, 4, 0.05, ",.4g"),
        "gbps": gbps,
    }

    def compute(h: float, n_tokens: float, tflops: float, gbps: float) -> Summary:
        return interconnect_summary(round(h), n_tokens, tflops * 1e12, gbps * 1e9)

    explorer = Explorer(controls, compute, describe_interconnect, plot_interconnect,
                        header=(preset,))
    explorer.preset = preset
    return explorer
