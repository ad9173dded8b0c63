r"""Module 03 widget: a layer's activation memory per rank, region by region, TP against TP + SP.

Same pattern as `parlab.widgets` (Explorer, `log_slider`):

    activation_summary(b, s, h, a, t, *, recompute_scores=False) -> summary dict (numbers)
    describe_activations(summary) -> str (HTML)
    plot_activations(summary) -> Figure (stacked bars by region; totals against t)
    activation_explorer(...) -> Explorer with sliders b, s, h, a, t and a checkbox

The numbers are `parlab.costs.activation_breakdown` (Korthikanti et al. 2022, fp16
activations, bytes per layer and rank): one device $sbh(34 + 5as/h)$, TP
$sbh(10 + 24/t + 5as/(ht))$, TP + SP $\frac{sbh}{t}(34 + 5as/h)$. With recompute_scores the
attention scores ($5as^2b$) are not kept but recomputed in backward, as FlashAttention and
Megatron's selective recomputation do.

`plot_sp_layout(t)` draws what each rank holds of a (T, C) activation in each region of a
layer under TP and under TP + SP.

The notebook's tables, as Markdown text (`IPython.display.Markdown`):

    activation_table(b, s, h, a, t)  -> by region: one device, TP, TP + SP (closed forms)
    sp_bytes_table(measured, ...)    -> bytes per layer: measured by the check, and at scale,
                                        with and without Megatron's backward re-gathers
    layer_memory_table(tp, sp, ...)  -> saved bytes by region, measured on a real layer
"""

from __future__ import annotations

import ipywidgets as widgets
import matplotlib.pyplot as plt
from matplotlib.axes import Axes
from matplotlib.figure import Figure
from matplotlib.patches import Rectangle

from parlab import costs
from parlab.costs.activations import REGIONS, activation_breakdown
from parlab.tp.sequence import sp_bytes_per_layer
from parlab.widgets.explorer import Explorer, Summary, log_slider

T_VALUES = (1, 2, 4, 8, 16)
HEADS = (8, 16, 32, 40, 48, 64, 96, 128)
SCORES = "attention scores (softmax, mask, dropout)"
REPLICATED = [name for name, (_, split) in REGIONS.items() if not split]  # what TP leaves whole
COLOURS = dict(zip(REGIONS, ("tab:orange", "tab:red", "tab:pink", "tab:blue", "tab:purple",
                             "tab:cyan"), strict=True))


def _breakdown(b: int, s: int, h: int, a: int, t: int, *, sp: bool,
               recompute_scores: bool) -> dict[str, float]:
    return activation_breakdown(b, s, h, a, t, sp=sp, keep_scores=not recompute_scores)


def _figure_of(ax: Axes) -> Figure:
    fig = ax.get_figure(root=True)
    assert isinstance(fig, Figure), "an Axes drawn by these widgets belongs to a Figure"
    return fig


def activation_summary(b: int, s: int, h: int, a: int, t: int, *,
                       recompute_scores: bool = False) -> Summary:
    """Bytes per layer and rank for one device, TP and TP + SP at this t, and against t.

    Keys: the inputs; "settings" (three labels); "breakdown" {label: {region: bytes}};
    "totals" {label: bytes}; "replicated" {label: bytes of the regions TP leaves whole};
    "ts", "tp_by_t", "sp_by_t" (totals for every t in T_VALUES); "saving" (TP total minus
    TP + SP total) and "ratio" (TP total / TP + SP total).
    """
    labels = ["one device", f"TP, t = {t}", f"TP + SP, t = {t}"]
    cases = [(1, False), (t, False), (t, True)]
    breakdown = {lab: _breakdown(b, s, h, a, n, sp=sp, recompute_scores=recompute_scores)
                 for lab, (n, sp) in zip(labels, cases, strict=True)}
    totals = {lab: sum(parts.values()) for lab, parts in breakdown.items()}
    return {
        "b": b, "s": s, "h": h, "a": a, "t": t, "recompute_scores": recompute_scores,
        "settings": labels, "breakdown": breakdown, "totals": totals,
        "replicated": {lab: sum(parts[r] for r in REPLICATED) for lab, parts in breakdown.items()},
        "ts": list(T_VALUES),
        "tp_by_t": [sum(_breakdown(b, s, h, a, n, sp=False,
                                   recompute_scores=recompute_scores).values()) for n in T_VALUES],
        "sp_by_t": [sum(_breakdown(b, s, h, a, n, sp=True,
                                   recompute_scores=recompute_scores).values()) for n in T_VALUES],
        "saving": totals[labels[1]] - totals[labels[2]],
        "ratio": totals[labels[1]] / totals[labels[2]],
    }


def _size(nbytes: float) -> str:
    return f"{nbytes / 2**30:,.2f} GiB" if nbytes >= 2**30 else f"{nbytes / 2**20:,.1f} MiB"


def describe_activations(summary: Summary) -> str:
    s = summary
    one, tp, sp = s["settings"]
    share = s["replicated"][tp] / s["totals"][tp]
    scores = ("attention scores recomputed in backward (not kept)" if s["recompute_scores"]
              else "attention scores kept")
    return (f"b = {s['b']}, s = {s['s']:,}, h = {s['h']:,}, a = {s['a']}, fp16, {scores}; "
            f"per layer and rank:<br>one device <b>{_size(s['totals'][one])}</b>; "
            f"TP <b>{_size(s['totals'][tp])}</b>, of which {_size(s['replicated'][tp])} "
            f"({share:.0%}) is the LayerNorm, dropout and GEMM-input regions TP leaves whole; "
            f"TP + SP <b>{_size(s['totals'][sp])}</b>: {s['ratio']:.2f}&times; less than TP, "
            f"{_size(s['saving'])} saved per layer for the same bytes on the wire")


def plot_activations(summary: Summary, axes: tuple[Axes, Axes] | None = None) -> Figure:
    """Left: stacked bars by region for the three settings. Right: totals against t."""
    if axes is None:
        fig, axes = plt.subplots(1, 2, figsize=(10.5, 4.2), layout="constrained",
                                 gridspec_kw={"width_ratios": [1.2, 1]})
    left, right = axes
    fig = _figure_of(left)
    s, unit = summary, 2**20
    bottoms = [0.0] * len(s["settings"])
    for region in REGIONS:
        values = [s["breakdown"][lab][region] / unit for lab in s["settings"]]
        hatch = None if region in REPLICATED else "//"
        left.bar(s["settings"], values, bottom=bottoms, color=COLOURS[region], hatch=hatch,
                 edgecolor="white", label=region + (" (TP splits it)" if hatch else ""))
        bottoms = [b + v for b, v in zip(bottoms, values, strict=True)]
    left.set_ylabel("activation memory per layer and rank (MiB)")
    left.set_xlabel("setting")
    left.set_title(f"By region (b={s['b']}, s={s['s']:,}, h={s['h']:,}, a={s['a']})")
    left.legend(fontsize="x-small", loc="upper right", framealpha=0.9)
    right.plot(s["ts"], [v / unit for v in s["tp_by_t"]], "o-", color="tab:red", label="TP")
    right.plot(s["ts"], [v / unit for v in s["sp_by_t"]], "s-", color="tab:green",
               label="TP + SP")
    right.axvline(s["t"], color="black", ls=":", label=f"chosen t = {s['t']}")
    right.set_xscale("log", base=2)
    right.set_yscale("log")
    right.set_xticks(s["ts"], [str(n) for n in s["ts"]])
    right.set_xlabel("tensor-parallel size t")
    right.set_ylabel("MiB per layer and rank")
    right.set_title("TP alone levels off at the 10 sbh it cannot split")
    right.legend(fontsize="small")
    return fig


def activation_explorer(b: int = 1, s: int = 2048, h: int = 12288, a: int = 96,
                        t: int = 8, recompute_scores: bool = False) -> Explorer:
    """Defaults: Korthikanti et al.'s GPT-3 175B layer (s = 2048, h = 12288, a = 96, t = 8).

    Controls (keys of `.controls`): "b", "s", "h", "a", "t", "recompute_scores"."""
    wide = {"style": {"description_width": "10em"}, "layout": widgets.Layout(width="36em")}
    controls = {
        "b": widgets.IntSlider(value=b, min=1, max=32, description="micro-batch b",
                               continuous_update=False, **wide),
        "s": log_slider("sequence s", s, 2, 9, 17, 1, ",.0f"),
        "h": log_slider("hidden size h", h, 2, 10, 15, 0.5, ",.0f"),
        "a": widgets.SelectionSlider(options=list(HEADS), value=a, description="heads a",
                                     continuous_update=False, **wide),
        "t": widgets.SelectionSlider(options=list(T_VALUES), value=t, description="TP size t",
                                     continuous_update=False, **wide),
        "recompute_scores": widgets.Checkbox(value=recompute_scores, description=(
            "recompute attention scores (FlashAttention)"), style={"description_width": "10em"}),
    }

    def compute(b: int, s: float, h: float, a: int, t: int, recompute_scores: bool) -> Summary:
        return activation_summary(int(b), round(s), round(h), int(a), int(t),
                                  recompute_scores=bool(recompute_scores))

    return Explorer(controls, compute, describe_activations, plot_activations)


def plot_sp_layout(t: int = 2, ax: Axes | None = None) -> Figure:
    """What rank 0 holds of a (T, C) activation (T rows, C columns), region by region, under TP
    (top) and TP + SP (bottom): blue its own share, grey a copy every rank holds."""
    if ax is None:
        fig, ax = plt.subplots(figsize=(10.0, 3.6), layout="constrained")
    else:
        fig = _figure_of(ax)
    stages = [("LayerNorm", "rows"), ("enter", None), ("attention\n(by heads)", "cols"),
              ("leave", None), ("dropout +\nresidual", "rows")]
    for row, (label, sp) in enumerate((("TP", False), ("TP + SP", True))):
        y0 = 2.6 * (1 - row)
        ax.text(-0.3, y0 + 0.8, label, ha="right", va="center", fontweight="bold")
        x = 0.0
        for name, kind in stages:
            if kind is None:
                arrow = ("all-gather" if name == "enter" else "reduce-scatter") if sp else \
                    ("f (identity)" if name == "enter" else "g (all-reduce)")
                ax.annotate("", (x + 1.1, y0 + 0.8), (x, y0 + 0.8),
                            arrowprops={"arrowstyle": "->"})
                ax.text(x + 0.55, y0 + 1.0, arrow, ha="center", fontsize="x-small")
                x += 1.3
                continue
            whole = kind == "rows" and not sp  # a copy on every rank
            ax.add_patch(Rectangle((x, y0), 1.2, 1.6, edgecolor="black",
                                   facecolor="lightgrey" if whole else "white"))
            if kind == "cols":  # rank 0's columns: its heads, for all T tokens
                ax.add_patch(Rectangle((x, y0), 1.2 / t, 1.6, facecolor="tab:blue"))
            elif sp:  # rank 0's rows: its tokens, all C features
                ax.add_patch(Rectangle((x, y0 + 1.6 - 1.6 / t), 1.2, 1.6 / t,
                                       facecolor="tab:blue"))
            ax.text(x + 0.6, y0 - 0.25, name, ha="center", va="top", fontsize="small")
            x += 1.5
    ax.set_xlim(-1.6, x)
    ax.set_ylim(-1.0, 4.5)
    ax.axis("off")
    ax.set_title(f"What rank 0 of t = {t} holds of a (T × C) activation\nblue: its own share; "
                 "grey: a copy every rank holds; white: not held")
    return fig


# --- the notebook's tables --------------------------------------------------------------------

def _mib(nbytes: float) -> str:
    return f"{nbytes / 2**20:,.0f} MiB"


def activation_table(b: int, s: int, h: int, a: int, t: int) -> str:
    """Markdown: bytes per layer and rank, region by region, for one device, TP and TP + SP at
    t (`activation_breakdown`), then the share of TP's total that TP leaves whole."""
    settings = {"one device": (1, False), f"TP, t = {t}": (t, False),
                f"TP + SP, t = {t}": (t, True)}
    parts = {name: activation_breakdown(b, s, h, a, n, sp=sp)
             for name, (n, sp) in settings.items()}
    rows = ["| region | " + " | ".join(settings) + " |", "|---" * (len(settings) + 1) + "|"]
    rows += [f"| {region} | " + " | ".join(_mib(parts[n][region]) for n in settings) + " |"
             for region in REGIONS]
    totals = {n: sum(p.values()) for n, p in parts.items()}
    rows.append("| **per layer** | " + " | ".join(f"**{_mib(v)}**" for v in totals.values())
                + " |")
    tp_name = f"TP, t = {t}"
    whole = sum(parts[tp_name][r] for r in REPLICATED)
    return ("\n".join(rows) + f"\n\nUnder TP, {_mib(whole)} of the {_mib(totals[tp_name])} "
            f"per layer ({whole / totals[tp_name]:.0%}) are the regions every rank holds whole.")


def sp_bytes_table(measured: Summary, b: int, s: int, h: int, t: int,
                   dtype_bytes: int = 2, *, regathered: dict[str, float] | None = None) -> str:
    """Markdown: the bytes per layer and rank the check measured (`check_sp_bytes`' summary:
    "b", "s", "h", "t", "sp" by kind, "tp"), beside the closed forms at (b, s, h, t); then
    Megatron's TP + SP, which gathers each LayerNorm output again in backward
    (`sp_bytes_per_layer(..., regather=True)`), measured on parlab's `SPBlock(regather=True)`
    at the check's size when `regathered` (bytes by kind) is given."""
    m = measured
    big = sp_bytes_per_layer(b, s, h, t, dtype_bytes=dtype_bytes)
    again = sp_bytes_per_layer(b, s, h, t, dtype_bytes=dtype_bytes, regather=True)
    big_tp = costs.tp_bytes_per_layer(b, s, h, t, dtype_bytes=dtype_bytes)
    head = (f"| per layer and rank, forward + backward | measured (b={m['b']}, s={m['s']}, "
            f"h={m['h']}, t={m['t']}, float32) | b={b}, s={s:,}, h={h:,}, t={t}, "
            f"{dtype_bytes} B per element |")
    rows = [
        head, "|---|---|---|",
        f"| TP + SP, all-gathers | {m['sp']['all_gather']:,.0f} B | {_mib(big['all_gather'])} |",
        f"| TP + SP, reduce-scatters | {m['sp']['reduce_scatter']:,.0f} B "
        f"| {_mib(big['reduce_scatter'])} |",
        f"| **TP + SP, in all** | **{sum(m['sp'].values()):,.0f} B** "
        f"| **{_mib(sum(big.values()))}** |",
        f"| **plain TP, all-reduces** | **{m['tp']:,.0f} B** | **{_mib(big_tp)}** |",
    ]
    if regathered is not None:
        rows += [
            f"| Megatron's TP + SP (inputs gathered again in backward), all-gathers "
            f"| {regathered['all_gather']:,.0f} B | {_mib(again['all_gather'])} |",
            f"| **Megatron's TP + SP, in all** | **{sum(regathered.values()):,.0f} B** "
            f"| **{_mib(sum(again.values()))}** |"]
    return "\n".join(rows)


def layer_memory_table(tp_mem: dict[str, int], sp_mem: dict[str, int], *, yours: int,
                       sizes: str, regathered: dict[str, int] | None = None) -> str:
    """Markdown: bytes saved for backward by region (SavedTensorMeter.by_region) under TP and
    TP + SP, their ratio, and the learner's own count (`yours`) of their TP + SP layer; with
    `regathered`, a column for TP + SP whose GEMMs keep only their input's shard and gather it
    again in backward (`SPBlock(regather=True)`, Megatron's)."""
    again = regathered is not None
    rows = [f"| region ({sizes}) | TP | TP + SP | TP / (TP + SP) |"
            + (" TP + SP, re-gathered |" if again else ""),
            "|---|---|---|---|" + ("---|" if again else "")]
    for r in tp_mem:
        row = (f"| {r} | {tp_mem[r]:,} B | {sp_mem.get(r, 0):,} B | "
               + (f"{tp_mem[r] / sp_mem[r]:g} |" if sp_mem.get(r) else "- |"))
        rows.append(row + (f" {regathered.get(r, 0):,} B |" if regathered is not None else ""))
    tp_total, sp_total = sum(tp_mem.values()), sum(sp_mem.values())
    rows.append(f"| **whole layer** | **{tp_total:,} B** | **{sp_total:,} B** "
                f"| {tp_total / sp_total:.2f} |"
                + (f" **{sum(regathered.values()):,} B** |" if regathered is not None else ""))
    return ("\n".join(rows) + f"\n\nYour `saved_bytes` on your `SPBlock`: **{yours:,} B** "
            f"(the reference TP + SP layer: {sp_total:,} B).")
