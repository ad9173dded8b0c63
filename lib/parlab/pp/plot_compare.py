"""Two pipeline orders side by side: a table and what torch ran, or what ran and what was stored.

    plot_orders([("1F1B", table, executed), ...])   each pair simulated with the same costs and
                                                    drawn as space-time diagrams, one row per
                                                    schedule (parlab.pp.plot_timeline)
    plot_lists(executed, stored, titles=(...))      two per-rank lists drawn by position, one
                                                    box per action, without timing

In both, an action of the right-hand order that differs from the left-hand one at the same
place of the same rank's list is outlined in red, and the panel's title counts them.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from parlab.pp.actions import Schedule
from parlab.pp.plot import COLOURS, NAMES, _shade, plot_timeline
from parlab.pp.simulator import simulate

if TYPE_CHECKING:
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure

__all__ = ["plot_orders", "plot_lists", "differences"]

DIFFERENT = "#d62728"


def differences(left: Schedule, right: Schedule) -> list[list[int]]:
    """Per rank, the positions of `right` whose action is not `left`'s at that position."""
    out = []
    for a, b in zip(left, right, strict=True):
        out.append([i for i, x in enumerate(b) if i >= len(a) or a[i] != x])
    return out


def _outline(ax: Axes, boxes: Sequence[tuple[int, float, float]]) -> None:
    from matplotlib.patches import Rectangle

    for r, start, width in boxes:
        ax.add_patch(Rectangle((start, r - 0.45), width, 0.9, fill=False, edgecolor=DIFFERENT,
                               linewidth=2.0))


def _said(diff: list[list[int]]) -> str:
    n = sum(len(d) for d in diff)
    return "the same order on every rank" if n == 0 else \
        f"{n} action{'s' if n > 1 else ''} differ (outlined)"


def plot_orders(pairs: Sequence[tuple[str, Schedule, Schedule]], *, t_f: float = 1.0,
                t_b: float = 1.0, t_w: float = 1.0,
                names: tuple[str, str] = ("your table", "torch ran")) -> Figure:
    """One row per (label, left, right): both simulated with the same costs and drawn on one
    time axis, left and right; the right's actions that differ from the left's outlined."""
    from matplotlib import pyplot as plt

    p = max(len(left) for _, left, _ in pairs)
    fig, axes = plt.subplots(len(pairs), 2, figsize=(15, len(pairs) * (1.0 + 0.5 * p)),
                             layout="constrained", squeeze=False, sharex="row")
    for row, (label, left, right) in zip(axes, pairs, strict=True):
        sims = [simulate(s, t_f, t_b, t_w) for s in (left, right)]
        diff = differences(left, right)
        for ax, sim, name in zip(row, sims, names, strict=True):
            plot_timeline(sim, ax, title=f"{label}: {name}")
        row[0].get_legend().remove()
        row[1].set_title(f"{label}: {names[1]}, {_said(diff)}")
        spans = sims[1].spans
        _outline(row[1], [(r, spans[r][i].start, spans[r][i].end - spans[r][i].start)
                          for r, d in enumerate(diff) for i in d if i < len(spans[r])])
    fig.suptitle(f"Each pair simulated with t_f = {t_f:g}, t_b = {t_b:g}, t_w = {t_w:g} per "
                 "rank's share (a chunk's action 1/v of it)")
    return fig


def _draw_list(ax: Axes, schedule: Schedule, v: int) -> None:
    for r, order in enumerate(schedule):
        for i, a in enumerate(order):
            ax.broken_barh([(i, 1.0)], (r - 0.4, 0.8),
                           facecolors=_shade(COLOURS[a.kind], a.chunk, v),
                           edgecolor="white", linewidth=0.5)
            ax.text(i + 0.5, r, str(a.microbatch), ha="center", va="center", fontsize=8,
                    color="white")


def plot_lists(left: Schedule, right: Schedule, *,
               titles: tuple[str, str] = ("what ran", "what was stored")) -> Figure:
    """The two per-rank lists by position (no timing), one above the other; the right's
    actions that differ from the left's at the same place outlined."""
    from matplotlib import pyplot as plt
    from matplotlib.patches import Patch

    p = len(left)
    v = 1 + max((a.chunk for order in (*left, *right) for a in order), default=0)
    fig, axes = plt.subplots(2, 1, figsize=(12, 1.2 + 1.0 * p), sharex=True,
                             layout="constrained")
    diff = differences(left, right)
    for ax, schedule, title in zip(axes, (left, right), titles, strict=True):
        _draw_list(ax, schedule, v)
        ax.set_ylim(p - 0.5, -0.5)
        ax.set_yticks(range(p), [f"rank {r}" for r in range(p)])
        ax.set_title(title)
    axes[1].set_title(f"{titles[1]}: {_said(diff)}")
    _outline(axes[1], [(r, float(i), 1.0) for r, d in enumerate(diff) for i in d])
    axes[1].set_xlim(0, max(len(o) for o in (*left, *right)))
    axes[1].set_xlabel("position in the rank's list (each box one action, labelled by "
                       "micro-batch)")
    kinds = {a.kind for order in (*left, *right) for a in order}
    handles = [Patch(color=COLOURS[k], label=NAMES[k]) for k in "FBW" if k in kinds]
    handles.append(Patch(facecolor="white", edgecolor=DIFFERENT, label="differs"))
    axes[0].legend(handles=handles, loc="upper left", bbox_to_anchor=(1.0, 1.0),
                   fontsize="small", frameon=False)
    return fig
