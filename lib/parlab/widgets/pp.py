r"""Module 04 widget: a pipeline schedule's space-time diagram, bubble and peak memory.

Same pattern as `parlab.widgets` (Explorer: controls -> compute -> describe + plot):

    pipeline_summary(schedule, p, m, v, t_f, t_b, t_w, latency) -> summary dict
    describe_pipeline(summary) -> str (HTML)
    plot_pipeline(summary, ax=None) -> Figure (parlab.pp.plot_timeline)
    pipeline_explorer(...) -> Explorer with a schedule dropdown and sliders

Numbers come from `parlab.pp.simulate` and, beside them, the closed forms of
`parlab.costs`: the share of the step $\frac{p-1}{vm+p-1}$ (GPipe's accounting,
arXiv:1811.06965) and the ratio to useful time $\frac{p-1}{vm}$ (Megatron's bubble time
fraction, Narayanan et al., arXiv:2104.04473). v applies to interleaved 1F1B only, which also
needs m to be a multiple of p: other values are adjusted and the adjustment is said.
"""

from __future__ import annotations

import math
from typing import Any

import ipywidgets as widgets
from matplotlib.axes import Axes
from matplotlib.figure import Figure

from parlab import costs
from parlab.pp.plot import plot_timeline
from parlab.pp.schedules import make_schedule
from parlab.pp.simulator import simulate
from parlab.widgets.explorer import Explorer, Summary

SCHEDULES = {"GPipe": "gpipe", "1F1B": "1f1b", "interleaved 1F1B": "interleaved_1f1b",
             "ZB-H1 (zero bubble)": "zb_h1"}
LABELS = {v: k for k, v in SCHEDULES.items()}


def pipeline_summary(schedule: str, p: int, m: int, v: int, t_f: float, t_b: float,
                     t_w: float, latency: float = 0.0) -> Summary:
    """Simulate `schedule` and collect what the widget shows (see the module docstring).

    Keys: the inputs as used ("p", "m", "v", costs), "notes" (adjustments), "result" (the
    SimResult), "bubble", "formula" and "formula_ratio" (parlab.costs), "ratio" (simulated
    idle / useful), "peak" (rank 0's peak activations), "peak_1f1b" and "bubble_1f1b" (1F1B
    with the same p, m and costs), "messages" (point-to-point messages per step)."""
    notes = []
    if schedule != "interleaved_1f1b" and v != 1:
        notes.append(f"v = {v} applies to interleaved 1F1B only; {LABELS[schedule]} uses v = 1")
        v = 1
    if schedule == "interleaved_1f1b" and v > 1 and m % p:
        fixed = math.ceil(m / p) * p
        notes.append(f"interleaved 1F1B needs m to be a multiple of p: m = {m} -> {fixed}")
        m = fixed
    result = simulate(make_schedule(schedule, p, m, v), t_f, t_b, t_w, latency=latency)
    base = simulate(make_schedule("1f1b", p, m), t_f, t_b, t_w, latency=latency)
    return {
        "schedule": schedule, "p": p, "m": m, "v": v, "t_f": t_f, "t_b": t_b, "t_w": t_w,
        "latency": latency, "notes": notes, "result": result,
        "bubble": result.bubble_fraction, "ratio": result.bubble_ratio,
        "formula": costs.bubble_fraction(p, m, v), "formula_ratio": costs.bubble_ratio(p, m, v),
        "peak": result.peak_activations[0], "peak_1f1b": base.peak_activations[0],
        "bubble_1f1b": base.bubble_fraction,
        "messages": 2 * m * (p * v - 1),  # every stage boundary, forward and backward
    }


def describe_pipeline(summary: Summary) -> str:
    s = summary
    lines = [f"<b>{LABELS[s['schedule']]}</b>, p = {s['p']}, m = {s['m']}"
             + (f", v = {s['v']}" if s["v"] > 1 else "")
             + f": bubble <b>{s['bubble']:.1%}</b> of the step (simulated), idle / useful = "
             f"{s['ratio']:.1%}"]
    if s["schedule"] == "zb_h1":
        lines.append(f"1F1B with the same costs: {s['bubble_1f1b']:.1%} (its B costs t_b + t_w)")
    else:
        exact = " (equal: zero latency)" if abs(s["bubble"] - s["formula"]) < 1e-9 else (
            " (the simulation differs: latency, or W folded into B)")
        lines.append(f"closed forms: GPipe's share of the step (p&minus;1)/(vm+p&minus;1) = "
                     f"{s['formula']:.1%}{exact}; Megatron's ratio to useful time "
                     f"(p&minus;1)/(vm) = {s['formula_ratio']:.1%}")
    lines.append(f"peak activations on rank 0: <b>{s['peak']:g}</b> microbatches' worth "
                 f"(1F1B: {s['peak_1f1b']:g}, GPipe: {s['m']}); point-to-point messages per "
                 f"step: {s['messages']}")
    lines += [f"<i>{n}</i>" for n in s["notes"]]
    return "<br>".join(lines)


def plot_pipeline(summary: Summary, ax: Axes | None = None) -> Figure:
    s = summary
    title = (f"{LABELS[s['schedule']]}: p = {s['p']}, m = {s['m']}"
             + (f", v = {s['v']}" if s["v"] > 1 else "")
             + f" — bubble {s['bubble']:.1%}, peak {s['peak']:g} on rank 0")
    return plot_timeline(s["result"], ax, title=title, unit="t_f = 1" if s["t_f"] == 1 else "",
                         labels=s["m"] * s["v"] <= 16)


LABEL_EM = 14  # room for the longest description, "t_w (backward, weights)" (about 0.6 em a
# character at the widgets' font: 10 em cut it to "t_w (backward, w...")


def _slider(cls: Any, description: str, value: float, lo: float, hi: float,
            step: float) -> widgets.ValueWidget:
    return cls(value=value, min=lo, max=hi, step=step, description=description,
               continuous_update=False, style={"description_width": f"{LABEL_EM}em"},
               layout=widgets.Layout(width=f"{LABEL_EM + 20}em"))


def pipeline_explorer(schedule: str = "1f1b", p: int = 4, m: int = 8, v: int = 2,
                      t_f: float = 1.0, t_b: float = 2.0, t_w: float = 0.0,
                      latency: float = 0.0) -> Explorer:
    """Schedule dropdown and sliders for p, m, v, t_f, t_b, t_w and the p2p latency.

    Controls (keys of `.controls`): "schedule", "p", "m", "v", "t_f", "t_b", "t_w",
    "latency"."""
    controls = {
        "schedule": widgets.Dropdown(options=list(SCHEDULES.items()), value=schedule,
                                     description="schedule",
                                     style={"description_width": f"{LABEL_EM}em"}),
        "p": _slider(widgets.IntSlider, "stages p", p, 1, 8, 1),
        "m": _slider(widgets.IntSlider, "microbatches m", m, 1, 32, 1),
        "v": _slider(widgets.IntSlider, "chunks per rank v", v, 1, 4, 1),
        "t_f": _slider(widgets.FloatSlider, "t_f (forward)", t_f, 0.25, 4, 0.25),
        "t_b": _slider(widgets.FloatSlider, "t_b (backward, input)", t_b, 0, 4, 0.25),
        "t_w": _slider(widgets.FloatSlider, "t_w (backward, weights)", t_w, 0, 4, 0.25),
        "latency": _slider(widgets.FloatSlider, "p2p latency", latency, 0, 1, 0.05),
    }
    return Explorer(controls, pipeline_summary, describe_pipeline, plot_pipeline)
