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

DualPipe-V (`parlab.pp.dualpipe`) has two chunks per rank and needs m >= 2p; its overlapped
forward-backward pairs cost t_fb = t_f + t_b + t_w - overlap * min(t_f, t_b + t_w), overlap
in [0, 1] the share of the shorter half the other hides (two streams on a GPU). Beside the
simulation it shows DualPipe's published bubble, $(p-1)(F\&B + B - 3W)$ with per-chunk costs,
the last rank's idle time when a chunk's F, B and W cost the same. `compare=True` draws
1F1B, ZB-H1, interleaved 1F1B (v = 2) and DualPipe-V with the same p, m and costs, one above
the other on one time axis (`plot_compared`).
"""

from __future__ import annotations

import math
from typing import Any

import ipywidgets as widgets
from matplotlib import pyplot as plt
from matplotlib.axes import Axes
from matplotlib.figure import Figure

from parlab import costs
from parlab.pp.dualpipe import dualpipe_v_bubble
from parlab.pp.plot import plot_timeline
from parlab.pp.schedules import make_schedule
from parlab.pp.simulator import SimResult, simulate
from parlab.widgets.explorer import Explorer, Summary

SCHEDULES = {"GPipe": "gpipe", "1F1B": "1f1b", "interleaved 1F1B": "interleaved_1f1b",
             "ZB-H1 (zero bubble)": "zb_h1", "DualPipe-V (two chunks in a V)": "dualpipe_v"}
LABELS = {v: k for k, v in SCHEDULES.items()}
COMPARED = ("1f1b", "zb_h1", "interleaved_1f1b", "dualpipe_v")
"""The schedules `plot_compared` draws one above the other."""


def pair_cost(t_f: float, t_b: float, t_w: float, overlap: float) -> float:
    """A rank's whole-share forward and backward run as overlapped pairs (module docstring)."""
    return t_f + t_b + t_w - overlap * min(t_f, t_b + t_w)


def _adjusted(schedule: str, p: int, m: int, v: int) -> tuple[int, int, list[str]]:
    """(m, v) the schedule can run, and a note for each change."""
    notes = []
    if schedule == "dualpipe_v":
        if v != 2:
            notes.append(f"DualPipe-V always has two chunks per rank (v = 2), not v = {v}")
        if m < 2 * p:
            notes.append(f"DualPipe-V needs m >= 2p micro-batches: m = {m} -> {2 * p}")
        return max(m, 2 * p), 2, notes
    if schedule != "interleaved_1f1b" and v != 1:
        notes.append(f"v = {v} applies to interleaved 1F1B only; {LABELS[schedule]} uses v = 1")
        v = 1
    if schedule == "interleaved_1f1b" and v > 1 and m % p:
        fixed = math.ceil(m / p) * p
        notes.append(f"interleaved 1F1B needs m to be a multiple of p: m = {m} -> {fixed}")
        m = fixed
    return m, v, notes


def _run(schedule: str, p: int, m: int, v: int, t_f: float, t_b: float, t_w: float,
         latency: float, t_fb: float) -> SimResult:
    return simulate(make_schedule(schedule, p, m, v if schedule == "interleaved_1f1b" else 1),
                    t_f, t_b, t_w, latency=latency,
                    t_fb=t_fb if schedule == "dualpipe_v" else None)


def pipeline_summary(schedule: str, p: int, m: int, v: int, t_f: float, t_b: float,
                     t_w: float, latency: float = 0.0, overlap: float = 0.0,
                     compare: bool = False) -> Summary:
    """Simulate `schedule` and collect what the widget shows (see the module docstring).

    Keys: the inputs as used ("p", "m", "v", costs, "t_fb"), "notes" (adjustments), "result"
    (the SimResult), "bubble", "formula" and "formula_ratio" (parlab.costs), "ratio"
    (simulated idle / useful), "peak" (rank 0's peak activations), "peak_1f1b" and
    "bubble_1f1b" (1F1B with the same p, m and costs), "messages" (point-to-point messages
    per step); for DualPipe-V "published" (DualPipe's bubble) and "idle_last" (the last
    rank's simulated idle); with compare, "compared" {schedule: SimResult}."""
    m, v, notes = _adjusted(schedule, p, m, v)
    t_fb = pair_cost(t_f, t_b, t_w, overlap)
    result = _run(schedule, p, m, v, t_f, t_b, t_w, latency, t_fb)
    base = simulate(make_schedule("1f1b", p, m), t_f, t_b, t_w, latency=latency)
    local = 2 * m if schedule == "dualpipe_v" else 0  # stages p-1 and p share rank p-1
    out = {
        "schedule": schedule, "p": p, "m": m, "v": v, "t_f": t_f, "t_b": t_b, "t_w": t_w,
        "latency": latency, "overlap": overlap, "t_fb": t_fb, "notes": notes, "result": result,
        "bubble": result.bubble_fraction, "ratio": result.bubble_ratio,
        "formula": costs.bubble_fraction(p, m, v), "formula_ratio": costs.bubble_ratio(p, m, v),
        "peak": result.peak_activations[0], "peak_1f1b": base.peak_activations[0],
        "bubble_1f1b": base.bubble_fraction,
        "messages": 2 * m * (p * v - 1) - local,  # every stage boundary, forward and backward
    }
    if schedule == "dualpipe_v":
        out["published"] = dualpipe_v_bubble(p, t_f / 2, (t_b + t_w) / 2, t_w / 2, t_fb / 2)
        out["idle_last"] = result.idle[-1]
    if compare:
        compared: dict[str, SimResult] = {}
        for name in COMPARED:
            mm, vv, _ = _adjusted(name, p, m, 2)
            compared[name] = _run(name, p, mm, vv, t_f, t_b, t_w, latency, t_fb)
        out["compared"] = compared
    return out


def describe_pipeline(summary: Summary) -> str:
    s = summary
    lines = [f"<b>{LABELS[s['schedule']]}</b>, p = {s['p']}, m = {s['m']}"
             + (f", v = {s['v']}" if s["v"] > 1 else "")
             + f": bubble <b>{s['bubble']:.1%}</b> of the step (simulated), idle / useful = "
             f"{s['ratio']:.1%}"]
    if s["schedule"] == "zb_h1":
        lines.append(f"1F1B with the same costs: {s['bubble_1f1b']:.1%} (its B costs t_b + t_w)")
    elif s["schedule"] == "dualpipe_v":
        same = s["t_f"] == s["t_b"] == s["t_w"]
        lines.append(
            f"DualPipe's published bubble (p&minus;1)(F&amp;B + B &minus; 3W), per chunk F = "
            f"{s['t_f'] / 2:g}, B = {(s['t_b'] + s['t_w']) / 2:g}, W = {s['t_w'] / 2:g}, "
            f"F&amp;B = {s['t_fb'] / 2:g}: <b>{s['published']:g}</b>; the last rank idles "
            f"{s['idle_last']:g} (simulated)" + (" (exact when t_f = t_b = t_w)" if same else
            " (the published form is exact only when t_f = t_b = t_w)")
            + f"; 1F1B with the same costs: {s['bubble_1f1b']:.1%}")
    else:
        exact = " (equal: zero latency)" if abs(s["bubble"] - s["formula"]) < 1e-9 else (
            " (the simulation differs: latency, or W folded into B)")
        lines.append(f"closed forms: GPipe's share of the step (p&minus;1)/(vm+p&minus;1) = "
                     f"{s['formula']:.1%}{exact}; Megatron's ratio to useful time "
                     f"(p&minus;1)/(vm) = {s['formula_ratio']:.1%}")
    if "compared" in s:
        lines.append("compared (same p, costs; m as each schedule needs): " + ", ".join(
            f"{LABELS[n]} {r.bubble_fraction:.1%}" for n, r in s["compared"].items()))
    lines.append(f"peak activations on rank 0: <b>{s['peak']:g}</b> microbatches' worth "
                 f"(1F1B: {s['peak_1f1b']:g}, GPipe: {s['m']}); point-to-point messages per "
                 f"step: {s['messages']}")
    lines += [f"<i>{n}</i>" for n in s["notes"]]
    return "<br>".join(lines)


def plot_compared(results: dict[str, SimResult], *, title: str = "") -> Figure:
    """The schedules' diagrams one above the other on one time axis."""
    fig, axes = plt.subplots(len(results), 1, sharex=True, layout="constrained",
                             figsize=(11, 0.6 + sum(0.5 * len(r.spans) + 0.4
                                                    for r in results.values())))
    for ax, (name, r) in zip(axes, results.items(), strict=True):
        plot_timeline(r, ax, title=f"{LABELS[name]}: bubble {r.bubble_fraction:.1%}, peak "
                      f"{max(r.peak_activations):g}, makespan {r.makespan:.3g}",
                      labels=r.m * r.v <= 16)
    if title:
        fig.suptitle(title)
    return fig


def plot_pipeline(summary: Summary, ax: Axes | None = None) -> Figure:
    s = summary
    if "compared" in s and ax is None:
        return plot_compared(s["compared"], title=f"p = {s['p']}, same costs")
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
                      latency: float = 0.0, overlap: float = 0.0,
                      compare: bool = False) -> Explorer:
    """Schedule dropdown and sliders for p, m, v, t_f, t_b, t_w, the p2p latency and
    DualPipe-V's F&B overlap; a box to draw 1F1B, ZB-H1, interleaved and DualPipe-V together.

    Controls (keys of `.controls`): "schedule", "p", "m", "v", "t_f", "t_b", "t_w",
    "latency", "overlap", "compare"."""
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
        "overlap": _slider(widgets.FloatSlider, "F&B overlap", overlap, 0, 1, 0.1),
        "compare": widgets.Checkbox(value=compare, description="compare four schedules",
                                    style={"description_width": f"{LABEL_EM}em"}),
    }
    return Explorer(controls, pipeline_summary, describe_pipeline, plot_pipeline)
