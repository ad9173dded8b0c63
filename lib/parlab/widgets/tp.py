r"""Module 02 widget: a TP layer's communication time against t and the link, beside its compute.

Same pattern as `parlab.widgets` (whose Explorer, slider helper and link presets it reuses):

    tp_comm_summary(b, s, h, t, gbps, tflops, dtype_bytes) -> summary dict (pure numbers)
    describe_tp_comm(summary) -> str (HTML)
    plot_tp_comm(summary, ax=None) -> Figure
    tp_comm_explorer(...) -> Explorer with sliders and a link preset dropdown

Communication per layer and rank, forward + backward, is `parlab.costs.tp_bytes_per_layer`
($16\frac{t-1}{t}bsh$ bytes in bf16) over the link's bytes/s. Compute per layer and rank is
`layer_flops(b, s, h) / t` over the device's FLOP/s, with
$\text{layer\_flops} = 3\,(24bsh^2 + 4bs^2h)$: the forward's GEMMs (QKV and output projection
8bsh², MLP 16bsh²) plus attention's two score GEMMs (4bs²h), and a backward of twice the
forward. Both times assume perfect efficiency. The TP all-reduces sit between dependent GEMMs,
so unless an implementation overlaps them with compute (by splitting the GEMMs into chunks),
they are exposed: the layer takes comm + compute, and comm / (comm + compute) of its time is
spent waiting ("exposed_share"). comm / compute is a ratio, not a share.

`plot_mlp_sharding(t)` draws the column -> row MLP split of the notebook's figure;
`tp_cost_table(b, s, h, t)` is the notebook's table of one layer's bytes and times (Markdown).
"""

from __future__ import annotations

from typing import Any

import ipywidgets as widgets
import matplotlib.pyplot as plt
from matplotlib.axes import Axes
from matplotlib.figure import Figure
from matplotlib.patches import Rectangle

from parlab import costs
from parlab.widgets.explorer import Explorer, Summary, log_slider
from parlab.widgets.interconnect import CUSTOM, LINK_PRESETS_GBPS, link_preset_dropdown

T_VALUES = (1, 2, 4, 8, 16, 32, 64)
NVLINK_DOMAIN = 8  # GPUs per HGX/DGX H100 node: the NVLink/NVSwitch domain
DTYPES = {"bf16 (2 B)": 2, "fp32 (4 B)": 4}


def layer_flops(b: int, s: int, h: int) -> float:
    """FLOPs of one transformer layer, forward + backward: 3 (24 b s h^2 + 4 b s^2 h).

    A GEMM of an (m, k) by a (k, n) matrix costs 2mkn FLOPs. Forward, with m = bs tokens: QKV
    (h -> 3h) 6bsh^2, the output projection 2bsh^2, the MLP (h -> 4h -> h) 16bsh^2, and the
    two score GEMMs QK^T and (softmax)V 2bs^2h each; the backward computes the gradients of
    both operands of every GEMM, twice the forward. 3 x 24 bsh^2 = 72 bsh^2 is the GEMMs'
    share (module 00's 72BSH^2/t per rank); 12 bs^2h is attention's."""
    return 3.0 * (24 * b * s * h * h + 4 * b * s * s * h)


def _figure_of(ax: Axes) -> Figure:
    fig = ax.get_figure(root=True)
    assert isinstance(fig, Figure), "an Axes drawn by these widgets belongs to a Figure"
    return fig


def _times(b: int, s: int, h: int, t: int, bandwidth: float, flops: float,
           dtype_bytes: int) -> tuple[float, float, float]:
    sent = costs.tp_bytes_per_layer(b, s, h, t, dtype_bytes=dtype_bytes)
    return sent, costs.transfer_time(sent, bandwidth), layer_flops(b, s, h) / t / flops


def tp_comm_summary(b: int, s: int, h: int, t: int, gbps: float, tflops: float,
                    dtype_bytes: int = 2) -> Summary:
    """Per-layer, per-rank bytes and seconds (forward + backward) for every t in T_VALUES.

    gbps in GB/s (1e9 B/s), tflops in TFLOP/s (1e12). Keys: the inputs, "ts", "bytes",
    "comm_s", "compute_s" (lists over ts), "others" (comm_s per link preset), and the values
    at the chosen t: "sent", "comm", "compute", "ratio" (comm / compute) and
    "exposed_share" (comm / (comm + compute): the share of the step spent waiting when
    nothing overlaps).
    """
    bw, fl = gbps * 1e9, tflops * 1e12
    rows = [_times(b, s, h, n, bw, fl, dtype_bytes) for n in T_VALUES]
    sent, comm, compute = _times(b, s, h, t, bw, fl, dtype_bytes)
    others = {name: [costs.transfer_time(r[0], g * 1e9) for r in rows]
              for name, g in LINK_PRESETS_GBPS.items() if abs(g - gbps) > 1e-9}
    return {
        "b": b, "s": s, "h": h, "t": t, "gbps": gbps, "tflops": tflops,
        "dtype_bytes": dtype_bytes, "ts": list(T_VALUES), "bytes": [r[0] for r in rows],
        "comm_s": [r[1] for r in rows], "compute_s": [r[2] for r in rows], "others": others,
        "sent": sent, "comm": comm, "compute": compute,
        "ratio": comm / compute, "exposed_share": comm / (comm + compute),
    }


def _ms(seconds: float) -> str:
    return f"{seconds * 1e3:,.3g} ms"


def describe_tp_comm(summary: Summary) -> str:
    s = summary
    verdict = (f"communication takes {s['ratio']:.2f}x as long as compute: the link, not the "
               "GPU, sets the pace" if s["ratio"] > 1 else
               f"communication takes {s['ratio']:.2f}x as long as compute (a ratio)")
    return (f"t = {s['t']}, b = {s['b']}, s = {s['s']:,}, h = {s['h']:,}, "
            f"{s['dtype_bytes']} B per element: each rank sends "
            f"<b>{s['sent'] / 2**20:,.0f} MiB</b> per layer (forward + backward)<br>"
            f"over {s['gbps']:,.4g} GB/s: <b>{_ms(s['comm'])}</b> of communication against "
            f"<b>{_ms(s['compute'])}</b> of compute at {s['tflops']:,.4g} TFLOP/s; {verdict}; "
            f"not overlapped, communication is an exposed <b>{s['exposed_share']:.0%}</b> of "
            "the layer's time (comm / (comm + compute))")


def plot_tp_comm(summary: Summary, ax: Axes | None = None) -> Figure:
    """Time per layer and rank against t (log-log): comm on this link, other links, compute."""
    if ax is None:
        fig, ax = plt.subplots(figsize=(7.0, 4.2), layout="constrained")
    else:
        fig = _figure_of(ax)
    s, ts = summary, summary["ts"]
    ms = [1e3 * x for x in s["compute_s"]]
    ax.axvspan(ts[0] * 0.8, NVLINK_DOMAIN * 1.2, color="tab:green", alpha=0.08,
               label=f"one NVLink domain (t ≤ {NVLINK_DOMAIN})")
    for name, values in s["others"].items():
        ax.plot(ts[1:], [1e3 * v for v in values[1:]], color="grey", alpha=0.45, lw=1,
                ls=":")
        ax.annotate(name.split(" (")[0], (ts[-1], 1e3 * values[-1]), fontsize="x-small",
                    color="grey", xytext=(3, 0), textcoords="offset points", va="center")
    ax.plot(ts[1:], [1e3 * v for v in s["comm_s"][1:]], "o-", color="tab:red",
            label=f"TP communication at {s['gbps']:,.4g} GB/s")
    ax.plot(ts, ms, "s--", color="tab:blue", label=f"compute at {s['tflops']:,.4g} TFLOP/s")
    if s["t"] > 1:
        ax.plot([s["t"]], [1e3 * s["comm"]], "o", ms=12, mfc="none", mec="black",
                label=f"chosen t = {s['t']}")
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xticks(ts, [str(n) for n in ts])
    ax.set_xlim(ts[0] * 0.8, ts[-1] * 2.5)
    ax.set_xlabel("tensor-parallel size t (GPUs sharing each layer)")
    ax.set_ylabel("time per layer per rank, forward + backward (ms)")
    ax.set_title(f"TP communication vs compute per layer (b={s['b']}, s={s['s']:,}, "
                 f"h={s['h']:,})")
    ax.legend(loc="lower left", fontsize="small")
    return fig


def tp_comm_explorer(b: int = 1, s: int = 8192, h: int = 8192, t: int = 8,
                     tflops: float = costs.H100_BF16_FLOPS / 1e12,
                     link: str = next(iter(LINK_PRESETS_GBPS)),
                     dtype: str = next(iter(DTYPES))) -> Explorer:
    """Sliders b, s, h, t, TFLOP/s and GB/s, a link preset and a dtype; defaults: the course's
    practice problem 2 (b = 1, s = h = 8192, t = 8, bf16, NVLink 900 GB/s, an H100's dense
    bf16 peak).

    Controls (keys of `.controls`): "b", "s", "h", "t", "tflops", "gbps", "dtype_bytes";
    the link dropdown is `.preset` (picking one moves the GB/s slider).
    """
    wide = {"style": {"description_width": "10em"}, "layout": widgets.Layout(width="36em")}
    gbps = log_slider("link GB/s", LINK_PRESETS_GBPS[link], 10, 0, 3.5, 0.01, ",.4g")
    preset = link_preset_dropdown(link)

    def preset_to_slider(change: dict[str, Any]) -> None:
        if change["new"] in LINK_PRESETS_GBPS:
            gbps.value = LINK_PRESETS_GBPS[change["new"]]

    def slider_to_preset(change: dict[str, Any]) -> None:
        match = [k for k, v in LINK_PRESETS_GBPS.items() if abs(v - change["new"]) < 1e-9]
        preset.value = match[0] if match else CUSTOM

    preset.observe(preset_to_slider, names="value")
    gbps.observe(slider_to_preset, names="value")
    controls = {
        "b": widgets.IntSlider(value=b, min=1, max=32, description="micro-batch b",
                               continuous_update=False, **wide),
        "s": log_slider("sequence s", s, 2, 9, 17, 1, ",.0f"),
        "h": log_slider("hidden size h", h, 2, 10, 15, 1, ",.0f"),
        "t": widgets.SelectionSlider(options=list(T_VALUES), value=t, description="TP size t",
                                     continuous_update=False, **wide),
        "tflops": log_slider("TFLOP/s per GPU", tflops, 10, 1, 4, 0.05, ",.4g"),
        "gbps": gbps,
        "dtype_bytes": widgets.Dropdown(options=list(DTYPES.items()), value=DTYPES[dtype],
                                        description="activations",
                                        style={"description_width": "10em"}),
    }

    def compute(b: int, s: float, h: float, t: int, tflops: float, gbps: float,
                dtype_bytes: int) -> Summary:
        return tp_comm_summary(int(b), round(s), round(h), int(t), gbps, tflops, dtype_bytes)

    explorer = Explorer(controls, compute, describe_tp_comm, plot_tp_comm, header=(preset,))
    explorer.preset = preset
    return explorer


def plot_mlp_sharding(t: int = 2, ax: Axes | None = None) -> Figure:
    """Diagram of the TP MLP Z = g(GeLU(f(X) A_i) B_i) on t ranks, one colour per rank."""
    if ax is None:
        fig, ax = plt.subplots(figsize=(8.0, 3.2), layout="constrained")
    else:
        fig = _figure_of(ax)
    colours = plt.get_cmap("tab10")

    def box(x: float, y: float, w: float, hgt: float, colour: Any, text: str = "") -> None:
        ax.add_patch(Rectangle((x, y), w, hgt, facecolor=colour, edgecolor="black", lw=0.8))
        if text:
            ax.text(x + w / 2, y + hgt / 2, text, ha="center", va="center", fontsize="small")

    box(0, 0, 1, 2, "lightgrey", "X\n(b·s × h)\nsame on\nevery rank")
    for i in range(t):  # A: h x 4h split by columns; B: 4h x h split by rows
        box(1.6 + i * 2.4 / t, 0, 2.4 / t, 2, colours(i), f"A{i + 1}")
        box(4.8 + i * 2.4 / t, 0, 2.4 / t, 2, colours(i), f"GeLU\n(XA{i + 1})" if t <= 4 else "")
        box(8.0, 2 - (i + 1) * 2 / t, 1.2, 2 / t, colours(i), f"B{i + 1}")
    box(10.6, 0, 1.6, 2, "white", "Z = Σᵢ\nGeLU(XAᵢ)Bᵢ\nsame on\nevery rank")
    for x0, x1, label in ((1.05, 1.55, "f"), (4.05, 4.75, ""), (7.25, 7.95, ""),
                          (9.25, 10.55, "g\nall-reduce")):
        ax.annotate("", (x1, 1), (x0, 1), arrowprops={"arrowstyle": "->"})
        ax.text((x0 + x1) / 2, 1.15, label, ha="center", fontsize="small",
                color="darkred" if label.startswith("g") else "black")
    ax.text(2.8, -0.3, f"A column-parallel: rank i holds h × 4h/{t}", ha="center",
            fontsize="small")
    ax.text(6.0, -0.3, "no communication", ha="center", fontsize="small")
    ax.text(8.6, -0.3, f"B row-parallel: 4h/{t} × h", ha="center", fontsize="small")
    ax.set_xlim(-0.2, 12.4)
    ax.set_ylim(-0.6, 2.4)
    ax.axis("off")
    ax.set_title(f"Tensor-parallel MLP on t = {t} ranks (colour = rank): one all-reduce "
                 "forward")
    return fig


def tp_cost_table(b: int, s: int, h: int, t: int, dtype_bytes: int = 2,
                  flops: float = costs.H100_BF16_FLOPS) -> str:
    """Markdown: one layer's TP bytes (`parlab.costs`) and, for each link preset, the time they
    take against the compute per rank (`layer_flops / t` at `flops`), the ratio of the two and
    the share of the layer's time that is exposed communication when nothing overlaps."""
    activation = b * s * h * dtype_bytes
    per_layer = costs.tp_bytes_per_layer(b, s, h, t, dtype_bytes=dtype_bytes)
    compute = layer_flops(b, s, h) / t / flops
    rows = ["| quantity | value |", "|---|---|",
            f"| one activation $bsh$, {dtype_bytes} B per element | {activation / 2**20:,.0f} "
            f"MiB ({activation:,} B) |",
            f"| sent per rank by one ring all-reduce, $2\\frac{{t-1}}{{t}}$ of it "
            f"| {costs.ring_allreduce_bytes(activation, t) / 2**20:,.0f} MiB |",
            f"| per layer: 4 all-reduces, forward + backward | {per_layer / 2**20:,.0f} MiB |",
            f"| compute per layer and rank, `layer_flops / t` at {flops / 1e12:,.0f} TFLOP/s "
            f"| {_ms(compute)} |"]
    links = ["", "| link | communication per layer | communication / compute "
             "| exposed share of the layer's time, no overlap |", "|---|---|---|---|"]
    for name, gbps in LINK_PRESETS_GBPS.items():
        comm = costs.transfer_time(per_layer, gbps * 1e9)
        links.append(f"| {name} | {_ms(comm)} | {comm / compute:.2f} "
                     f"| {comm / (comm + compute):.0%} |")
    return "\n".join(rows + links)
