r"""Module 01 widget: memory per device, by part, for every data-parallel strategy.

Same pattern as `parlab.widgets` (Explorer, `log_slider`):

    memory_summary(billions, layers, hidden, seq, micro_batch, strategy, dp, gpu, recompute)
        -> summary dict (numbers from parlab.costs.memory / parlab.costs)
    describe_memory(summary) -> str (HTML)
    plot_memory(summary) -> Figure (stacked bars per strategy against the GPU's memory,
        on a linear axis: in full, and cut at 1.6x the GPU's memory)
    memory_explorer(...) -> Explorer

State is 2 + 2 + 12 bytes per parameter, each part divided by dp where the strategy shards it;
activations are bf16, $sbh(34 + 5as/h)$ per layer ($34sbh$ with selective recomputation,
$2sbh$ per layer plus one layer's worth with full recomputation), never divided by dp.
"""

from __future__ import annotations

import ipywidgets as widgets
import matplotlib.pyplot as plt
from matplotlib.axes import Axes
from matplotlib.figure import Figure

from parlab import costs
from parlab.costs.memory import GPUS, PARTS, RECOMPUTE, device_memory, recompute_mode
from parlab.widgets.explorer import Explorer, Summary, log_slider

COLOURS = dict(zip(PARTS, ("tab:blue", "tab:orange", "tab:red", "tab:green"), strict=True))
DEGREES = (1, 2, 4, 8, 16, 32, 64, 128, 256)


def memory_summary(billions: float, layers: int, hidden: int, seq: int, micro_batch: int,
                   strategy: str, dp: int, gpu: str, recompute: bool | str = False) -> Summary:
    """Keys: the inputs; "n_params"; "capacity" (bytes); "bars" {strategy: {part: bytes}};
    "totals" {strategy: bytes}; "fits" {strategy: bool}; "chosen" (= strategy). `recompute`
    is "none", "selective" or "full" (False and True mean none and full)."""
    n = billions * 1e9
    bars = {s: device_memory(n, layers=layers, hidden=hidden, seq=seq, micro_batch=micro_batch,
                             strategy=s, dp=dp, recompute=recompute) for s in costs.STRATEGIES}
    totals = {s: sum(parts.values()) for s, parts in bars.items()}
    capacity = GPUS[gpu]
    return {"billions": billions, "layers": layers, "hidden": hidden, "seq": seq,
            "micro_batch": micro_batch, "strategy": strategy, "dp": dp, "gpu": gpu,
            "recompute": recompute_mode(recompute), "n_params": n, "capacity": capacity,
            "bars": bars, "totals": totals, "fits": {s: v <= capacity for s, v in totals.items()},
            "chosen": strategy}


def describe_memory(summary: Summary) -> str:
    s = summary
    parts = s["bars"][s["chosen"]]
    spread = ", ".join(f"{p} {v / 1e9:,.1f} GB" for p, v in parts.items())
    verdict = "fits" if s["fits"][s["chosen"]] else "does <b>not</b> fit"
    fitting = [k for k, ok in s["fits"].items() if ok]
    return (f"{s['billions']:g}B parameters, {s['chosen']} over {s['dp']} devices: "
            f"<b>{s['totals'][s['chosen']] / 1e9:,.1f} GB</b> per device ({spread}); "
            f"{verdict} in a {s['gpu']}. Strategies that fit: "
            f"{', '.join(fitting) or 'none (shard more, or add TP/PP)'}.")


def _root(ax: Axes) -> Figure:
    fig = ax.figure
    return fig if isinstance(fig, Figure) else fig.get_figure(root=True)


def _stacked(ax: Axes, s: Summary, limit: float | None) -> None:
    """Stacked bars per strategy, GB per device on a linear axis (heights keep their
    proportions); `limit` cuts the axis there and labels the bars that run past it."""
    names = list(s["bars"])
    bottoms = [0.0] * len(names)
    for part in PARTS:
        values = [s["bars"][name][part] / 1e9 for name in names]
        ax.bar(names, values, bottom=bottoms, color=COLOURS[part], label=part,
               edgecolor=["black" if n == s["chosen"] else "white" for n in names])
        bottoms = [b + v for b, v in zip(bottoms, values, strict=True)]
    cap = s["capacity"] / 1e9
    ax.axhline(cap, color="black", ls="--", label=f"{s['gpu']} memory ({cap:g} GB)")
    top = limit if limit is not None else max(*bottoms, cap) * 1.15
    ax.set_ylim(0, top)
    for i, total in enumerate(bottoms):
        if total > top:  # cut: say how tall it really is, inside the top of the bar
            ax.annotate(f"↑{total:,.0f}", (i, top), ha="center", va="top", fontsize=9,
                        xytext=(0, -3), textcoords="offset points", color="white")
        else:
            ax.annotate(f"{total:,.0f} GB", (i, total), ha="center", va="bottom", fontsize=9,
                        xytext=(0, 2), textcoords="offset points",
                        bbox={"fc": "white", "ec": "none", "pad": 0.5, "alpha": 0.8})
    ax.set_ylabel("GB per device (linear scale)")
    ax.set_xlabel(f"strategy, data-parallel degree {s['dp']}")


def plot_memory(summary: Summary, ax: Axes | None = None) -> Figure:
    """Stacked bars per strategy (GB per device, linear) against the GPU's memory (dashed):
    all of every bar on the left, and the same bars cut at 1.6x the GPU's memory on the right,
    where the strategies that fit can be read."""
    s = summary
    zoom: Axes | None = None
    if ax is None:
        fig, (ax, zoom) = plt.subplots(1, 2, figsize=(10, 4.4), layout="constrained")
    else:
        fig = _root(ax)
    _stacked(ax, s, None)
    ax.set_title("every bar in full")
    ax.legend(fontsize="small", loc="upper right")
    if zoom is not None:
        _stacked(zoom, s, 1.6 * s["capacity"] / 1e9)
        zoom.set_title(f"zoom on 0-{1.6 * s['capacity'] / 1e9:,.0f} GB (↑GB: a bar cut at the top)")
    fig.suptitle(f"{s['billions']:g}B params, {s['layers']} layers, h={s['hidden']:,}, "
                 f"s={s['seq']:,}, b={s['micro_batch']}, recomputation: {s['recompute']}",
                 fontsize=11)
    return fig


def memory_explorer(billions: float = 70.0, layers: int = 80, hidden: int = 8192,
                    seq: int = 4096, micro_batch: int = 1, strategy: str = "zero3",
                    dp: int = 32, gpu: str = "H100 80 GB",
                    recompute: bool | str = "full") -> Explorer:
    """The calculator: defaults are the 70B practice problem (70B on 32 H100s of 80 GB)."""
    controls = {
        "billions": log_slider("params (B)", billions, 10, -1, 3, 0.01, ".3g"),
        "layers": widgets.IntSlider(value=layers, min=1, max=160, description="layers"),
        "hidden": widgets.SelectionSlider(options=[1024 * 2**k for k in range(6)] + [12288],
                                          value=hidden, description="hidden"),
        "seq": widgets.SelectionSlider(options=[512 * 2**k for k in range(8)], value=seq,
                                       description="sequence"),
        "micro_batch": widgets.SelectionSlider(options=[1, 2, 4, 8, 16], value=micro_batch,
                                               description="micro-batch"),
        "strategy": widgets.Dropdown(options=list(costs.STRATEGIES), value=strategy,
                                     description="strategy"),
        "dp": widgets.SelectionSlider(options=list(DEGREES), value=dp, description="degree"),
        "gpu": widgets.Dropdown(options=list(GPUS), value=gpu, description="GPU"),
        "recompute": widgets.Dropdown(options=list(RECOMPUTE), value=recompute_mode(recompute),
                                      description="recompute"),
    }
    return Explorer(controls, memory_summary, describe_memory, plot_memory)
