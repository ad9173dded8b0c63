r"""Module 01 widget: memory per device, by part, for every data-parallel strategy.

Same pattern as `parlab.widgets` (Explorer, `log_slider`):

    memory_summary(billions, layers, hidden, seq, micro_batch, strategy, dp, gpu, recompute)
        -> summary dict (numbers from parlab.costs.memory / parlab.costs)
    describe_memory(summary) -> str (HTML)
    plot_memory(summary) -> Figure (a stacked bar per strategy against the GPU's memory)
    memory_explorer(...) -> Explorer

State is 2 + 2 + 12 bytes per parameter, each part divided by dp where the strategy shards it;
activations are bf16, $sbh(34 + 5as/h)$ per layer ($2sbh$ per layer plus one layer's worth
with full recomputation), never divided by dp.
"""

from __future__ import annotations

import ipywidgets as widgets
import matplotlib.pyplot as plt
from matplotlib.axes import Axes
from matplotlib.figure import Figure

from parlab import costs
from parlab.costs.memory import GPUS, PARTS, device_memory
from parlab.widgets.explorer import Explorer, Summary, log_slider

COLOURS = dict(zip(PARTS, ("tab:blue", "tab:orange", "tab:red", "tab:green"), strict=True))
DEGREES = (1, 2, 4, 8, 16, 32, 64, 128, 256)


def memory_summary(billions: float, layers: int, hidden: int, seq: int, micro_batch: int,
                   strategy: str, dp: int, gpu: str, recompute: bool = False) -> Summary:
    """Keys: the inputs; "n_params"; "capacity" (bytes); "bars" {strategy: {part: bytes}};
    "totals" {strategy: bytes}; "fits" {strategy: bool}; "chosen" (= strategy)."""
    n = billions * 1e9
    bars = {s: device_memory(n, layers=layers, hidden=hidden, seq=seq, micro_batch=micro_batch,
                             strategy=s, dp=dp, recompute=recompute) for s in costs.STRATEGIES}
    totals = {s: sum(parts.values()) for s, parts in bars.items()}
    capacity = GPUS[gpu]
    return {"billions": billions, "layers": layers, "hidden": hidden, "seq": seq,
            "micro_batch": micro_batch, "strategy": strategy, "dp": dp, "gpu": gpu,
            "recompute": recompute, "n_params": n, "capacity": capacity, "bars": bars,
            "totals": totals, "fits": {s: v <= capacity for s, v in totals.items()},
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


def plot_memory(summary: Summary, ax: Axes | None = None) -> Figure:
    """One stacked bar per strategy (GB per device), the GPU's memory as a dashed line."""
    if ax is None:
        fig, ax = plt.subplots(figsize=(8, 4.2), layout="constrained")
    fig = ax.figure
    s = summary
    names = list(s["bars"])
    bottoms = [0.0] * len(names)
    for part in PARTS:
        values = [s["bars"][name][part] / 1e9 for name in names]
        ax.bar(names, values, bottom=bottoms, color=COLOURS[part], label=part,
               edgecolor=["black" if n == s["chosen"] else "white" for n in names])
        bottoms = [b + v for b, v in zip(bottoms, values, strict=True)]
    ax.axhline(s["capacity"] / 1e9, color="black", ls="--", label=f"{s['gpu']} memory")
    ax.set_yscale("log")
    ax.set_ylabel("GB per device (log scale)")
    ax.set_xlabel(f"strategy, data-parallel degree {s['dp']}")
    ax.set_title(f"{s['billions']:g}B params, {s['layers']} layers, h={s['hidden']:,}, "
                 f"s={s['seq']:,}, b={s['micro_batch']}"
                 + (", full recomputation" if s["recompute"] else ""))
    ax.legend(fontsize="small", loc="upper right")
    return fig


def memory_explorer(billions: float = 70.0, layers: int = 80, hidden: int = 8192,
                    seq: int = 4096, micro_batch: int = 1, strategy: str = "zero3",
                    dp: int = 32, gpu: str = "H100 80 GB", recompute: bool = True) -> Explorer:
    """The calculator: defaults are seed 003's practice problem (70B on 32 H100s)."""
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
        "recompute": widgets.Checkbox(value=recompute, description="full recomputation"),
    }
    return Explorer(controls, memory_summary, describe_memory, plot_memory)
