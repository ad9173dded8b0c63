"""Space-time diagrams of pipeline schedules: ranks as rows, time as columns.

    plot_schedule(make_schedule("1f1b", 4, 8))                   simulate, then draw
    plot_timeline(result, ax=None, title=None, unit="")          draw a SimResult (simulated
                                                                 or measured)
    plot_side_by_side(predicted, measured)                       the two, one beside the other
    plot_bubbles(sweep)                                          measured (from a trace) vs
                                                                 simulated vs closed form, over m

Forward boxes are green, backward orange, weight-gradient (W) blue; later chunks of an
interleaved schedule are drawn darker; each box is labelled with its microbatch. Idle time,
the bubble, is the hatched red behind the boxes. An overlapped F&B unit (DualPipe-V simulated
with `t_fb`) is one box with a black border: its forward in the top half, its backward (B,
then W) in the bottom half.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from parlab.pp.actions import Schedule
from parlab.pp.measure import BubbleSweep
from parlab.pp.simulator import SimResult, Span, simulate

if TYPE_CHECKING:
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure
# matplotlib is imported by the functions that draw: rank processes import parlab.pp and never
# draw, and importing pyplot would cost each of them about a second of CPU.

__all__ = ["COLOURS", "plot_timeline", "plot_schedule", "plot_side_by_side", "plot_bubbles"]

COLOURS = {"F": "#59a14f", "B": "#f28e2b", "W": "#4e79a7"}
BUBBLE = "#d62728"
NAMES = {"F": "F: forward", "B": "B: backward", "W": "W: weight gradient"}


def _shade(colour: str, chunk: int, v: int) -> tuple[float, float, float]:
    """Chunk 0 in the base colour, later chunks darker."""
    from matplotlib import colors as mcolors

    r, g, b = mcolors.to_rgb(colour)
    k = 1.0 - 0.45 * chunk / max(1, v - 1) if v > 1 else 1.0
    return r * k, g * k, b * k


def plot_timeline(result: SimResult, ax: Axes | None = None, *, title: str | None = None,
                  unit: str = "", scale: float = 1.0, labels: bool = True) -> Figure:
    """Draw one timeline; times are multiplied by `scale` (1e3 with unit="ms")."""
    from matplotlib import pyplot as plt
    from matplotlib.figure import Figure
    from matplotlib.patches import Patch

    if ax is None:
        fig, ax = plt.subplots(figsize=(10, 0.5 + 0.55 * len(result.spans)),
                               layout="constrained")
    else:
        root = ax.get_figure(root=True)
        assert isinstance(root, Figure), "an Axes drawn on is on a figure"
        fig = root
    p, end = len(result.spans), result.makespan * scale
    ax.barh(range(p), [end] * p, left=0, height=0.8, color="none", edgecolor=BUBBLE,
            hatch="///", linewidth=0, alpha=0.5)
    kinds: set[str] = set()
    fused = False
    for r, row in enumerate(result.spans):
        groups: dict[tuple, list] = {}
        together: dict[tuple[float, float], list[Span]] = {}
        for s in row:
            together.setdefault((s.start, s.end), []).append(s)
        for pair in (u for u in together.values() if _is_unit(u)):
            _draw_unit(ax, r, pair, result, scale)
            kinds.update(s.action.kind for s in pair)
            fused = True
        for s in (s for u in together.values() if not _is_unit(u) for s in u):
            kinds.add(s.action.kind)
            groups.setdefault((s.action.kind, s.action.chunk), []).append(
                (s.start * scale, (s.end - s.start) * scale))
            width = (s.end - s.start) * scale
            if labels and width > end / 60 and (width > end / 45 or len(row) <= 40):
                ax.text(s.start * scale + width / 2, r, str(s.action.microbatch), ha="center",
                        va="center", fontsize=8 if width > end / 45 else 7, color="white")
        for (kind, chunk), bars in groups.items():
            ax.broken_barh(bars, (r - 0.4, 0.8), facecolors=_shade(COLOURS[kind], chunk,
                                                                    result.v),
                           edgecolor="white", linewidth=0.5)
    ax.set_ylim(p - 0.5, -0.5)  # rank 0 on top
    ax.set_yticks(range(p), [f"rank {r}" for r in range(p)])
    siblings = [a for a in ax.get_shared_x_axes().get_siblings(ax) if a is not ax]
    ax.set_xlim(0, max([end] + [a.get_xlim()[1] for a in siblings if a.has_data()]))
    ax.set_xlabel(f"time ({unit})" if unit else "time (units of the costs)")
    names = dict(NAMES, B="B: backward, input gradient") if "W" in kinds else NAMES
    handles = [Patch(color=COLOURS[k], label=names[k]) for k in "FBW" if k in kinds]
    if result.v > 1:
        handles.append(Patch(color=_shade(COLOURS["F"], result.v - 1, result.v),
                             label=f"darker: later chunks (v = {result.v})"))
    if fused:
        handles.append(Patch(facecolor="white", edgecolor="black",
                             label="F&B: forward (top) and backward (bottom) overlapped"))
    handles.append(Patch(facecolor="white", edgecolor=BUBBLE, hatch="///",
                         label=f"bubble {result.bubble_fraction:.1%}"))
    ax.legend(handles=handles, loc="upper left", bbox_to_anchor=(1.0, 1.0), fontsize="small",
              frameon=False)
    ax.set_title(title or f"p = {p}, m = {result.m}" + (f", v = {result.v}" if result.v > 1
                                                         else "") +
                 f": bubble {result.bubble_fraction:.1%}, makespan {end:.3g} {unit}".rstrip())
    return fig


def _is_unit(spans: list[Span]) -> bool:
    """Several actions over one interval, a forward among them: an overlapped F&B unit."""
    return (len(spans) > 1 and spans[0].end > spans[0].start
            and any(s.action.kind == "F" for s in spans))


def _draw_unit(ax: Axes, r: int, unit: list[Span], result: SimResult, scale: float) -> None:
    """One overlapped unit: F on the top half, the backward's B and W share the bottom half in
    the ratio of their costs; a black border around it."""
    from matplotlib.patches import Rectangle

    start, width = unit[0].start * scale, (unit[0].end - unit[0].start) * scale
    t_b, t_w = result.costs.get("t_b", 1.0), result.costs.get("t_w", 0.0)
    left = start
    for s in unit:
        a = s.action
        colour = _shade(COLOURS[a.kind], a.chunk, result.v)
        if a.kind == "F":
            ax.broken_barh([(start, width)], (r - 0.4, 0.4), facecolors=colour,
                           edgecolor="white", linewidth=0.5)
            continue
        share = (t_b if a.kind == "B" else t_w) / ((t_b + t_w) or 1.0)
        ax.broken_barh([(left, width * share)], (r, 0.4), facecolors=colour,
                       edgecolor="white", linewidth=0.5)
        left += width * share
    ax.add_patch(Rectangle((start, r - 0.4), width, 0.8, fill=False, edgecolor="black",
                           linewidth=0.8))


def plot_schedule(schedule: Schedule, t_f: float = 1.0, t_b: float = 2.0, t_w: float = 0.0,
                  *, latency: float = 0.0, ax: Axes | None = None,
                  title: str | None = None, t_fb: float | None = None) -> Figure:
    """Simulate `schedule` with these costs and draw it."""
    return plot_timeline(simulate(schedule, t_f, t_b, t_w, latency=latency, t_fb=t_fb), ax,
                         title=title)


def plot_side_by_side(predicted: SimResult, measured: SimResult, *, unit: str = "ms",
                      scale: float = 1e3, suptitle: str | None = None) -> Figure:
    """The simulator's prediction and a real run, on the same time axis, one beside the other."""
    from matplotlib import pyplot as plt

    fig, (left, right) = plt.subplots(1, 2, figsize=(14, 0.9 + 0.55 * len(predicted.spans)),
                                      sharex=True, sharey=True, layout="constrained")
    plot_timeline(predicted, left, unit=unit, scale=scale,
                  title=f"predicted (simulate): bubble {predicted.bubble_fraction:.1%}")
    plot_timeline(measured, right, unit=unit, scale=scale,
                  title=f"measured on {len(measured.spans)} ranks: bubble "
                        f"{measured.bubble_fraction:.1%}")
    end = max(predicted.makespan, measured.makespan) * scale
    left.set_xlim(0, end)
    left.get_legend().remove()  # one legend, on the right
    if suptitle:
        fig.suptitle(suptitle)
    return fig


def plot_bubbles(sweep: BubbleSweep) -> Figure:
    """One panel per schedule: the bubble against m, four ways (`parlab.pp.measure`)."""
    from matplotlib import pyplot as plt

    names = list(dict.fromkeys(r.config.name for r in sweep.rows))
    fig, axes = plt.subplots(1, len(names), figsize=(4.2 * len(names), 3.6), sharey=True,
                             layout="constrained", squeeze=False)
    series = (("formula", "closed form (= simulate, no latency)",
               dict(color="black", linestyle="--", marker="x")),
              ("simulated_latency", f"simulate, latency {sweep.latency * 1e3:.2f} ms (measured "
               "in flight)", dict(color="tab:blue", marker="s", markersize=4)),
              ("simulated_fitted", f"simulate, latency {sweep.fitted_latency * 1e3:.2f} ms "
               "(fitted)", dict(color="tab:green", linestyle=":", marker="^", markersize=4)),
              ("measured", "measured from the trace", dict(color=BUBBLE, marker="o",
                                                           linestyle="none", markersize=6)))
    for ax, name in zip(axes[0], names, strict=True):
        rows = sorted((r for r in sweep.rows if r.config.name == name), key=lambda r: r.config.m)
        ms = [r.config.m for r in rows]
        for key, label, style in series:
            ax.plot(ms, [100 * getattr(r, key) for r in rows], label=label, **style)
        v = rows[0].config.v
        ax.set_xscale("log", base=2)
        ax.set_xticks(ms, [str(m) for m in ms])
        ax.set_xlabel("micro-batches m")
        ax.set_title(f"{name}, p = {rows[0].config.p}" + (f", v = {v}" if v > 1 else ""))
        ax.grid(alpha=0.3)
    axes[0, 0].set_ylabel("bubble: idle share of the step (%)")
    axes[0, 0].set_ylim(bottom=0)
    handles, labels = axes[0, 0].get_legend_handles_labels()
    t_f, t_b, t_w = (round(c * 1e3, 2) for c in sweep.costs)
    fig.legend(handles, labels, loc="outside lower center", ncols=2, fontsize="small")
    fig.suptitle(f"The bubble over m: t_f = {t_f} ms, t_b = {t_b} ms, t_w = {t_w} ms per rank")
    return fig
