r"""Module 08's static picture of a traced 3D step: where the TP collectives, the PP messages
and the DP buckets sit, rank by rank.

    tl = parlab.timeline.load("run.json")          # run(..., trace="run.json")
    classify(tl, rank=0)                            # {"F": [...], "B": [...], "tp": [...], ...}
    plot_step_trace(tl, coords={r: (dp, pp, tp)})   # the last step of every rank

The ranges come from the names the code gives them (`parlab.compose.pipeline`, `parlab.dp.ddp`,
`parlab.comm`): "F mb1 chunk0" / "B ..." / "W ..." are pipeline actions; "comm all_gather ..."
and "comm reduce_scatter ..." the tensor- and sequence-parallel collectives inside a stage
(plain TP's all-reduces would look like the DP ones by name, so the picture is meant for TP
with SP); "send ..." / "recv ..." the pipeline's messages (a recv range is the wait for it);
"allreduce bucket k" the moment a DP bucket's all-reduce was started (from a gradient hook, or
in finish) and "wait bucket k" the time `finish` waited for it. The last step is the window
from the last "F mb0" any rank started to the last "wait bucket" any rank finished.
"""

from __future__ import annotations

from typing import Any

import matplotlib.pyplot as plt
from matplotlib.figure import Figure
from matplotlib.lines import Line2D
from matplotlib.patches import Patch

from parlab.timeline import Range, Timeline

KINDS = {  # kind -> (name prefixes, colour, label)
    "F": (("F mb",), "tab:green", "forward of a micro-batch (F mb i chunk c)"),
    "B": (("B mb",), "tab:orange", "backward (B)"),
    "W": (("W mb",), "tab:olive", "weight gradients (W)"),
    "tp": (("comm all_gather", "comm reduce_scatter"), "black",
           "TP + SP collective inside a stage (all-gather, reduce-scatter)"),
    "pp": (("send ", "recv "), "tab:red", "PP message (send, or wait for a recv)"),
    "dp": (("allreduce bucket",), "tab:blue", "DP bucket all-reduce started"),
    "wait": (("wait bucket",), "tab:cyan", "finish() waiting for a DP bucket"),
}


def classify(tl: Timeline, *, rank: int, window: tuple[float, float] | None = None
             ) -> dict[str, list[Range]]:
    """This rank's ranges by kind (KINDS), inside `window` (seconds) when given."""
    out: dict[str, list[Range]] = {k: [] for k in KINDS}
    for r in tl.ranges(rank=rank):
        if window is not None and not (window[0] <= r.start <= window[1]):
            continue
        kind = next((k for k, (prefixes, _, _) in KINDS.items() if r.name.startswith(prefixes)),
                    None)
        if kind is not None:
            out[kind].append(r)
    return out


def last_step(tl: Timeline) -> tuple[float, float]:
    """(start, end) of the last step: the last "F mb0" started by any rank, to the end of the
    last "wait bucket" (or of the last action when no bucket was waited for)."""
    firsts = [r.start for rank in tl.ranks for r in tl.ranges(rank=rank, prefix="F mb0 ")]
    if not firsts:
        raise ValueError("the trace has no 'F mb0 ...' range: was it made by a composed run?")
    per_rank = [max((r.start for r in tl.ranges(rank=rank, prefix="F mb0 ")), default=0.0)
                for rank in tl.ranks]
    start = min(per_rank)
    ends = [r.end for r in tl.ranges(prefix=("wait bucket", "B mb", "W mb")) if r.start >= start]
    return start, max(ends)


def _bars(ax: Any, ranges: list[Range], y: float, height: float, colour: str, t0: float, *,
          label: bool = False) -> None:
    ax.broken_barh([((r.start - t0) * 1e3, max(r.seconds * 1e3, 0.02)) for r in ranges],
                   (y, height), facecolors=colour, edgecolor="white" if label else "none",
                   linewidth=0.8)
    if label:  # "F1" inside a forward of micro-batch 1 (chunk c shown when c > 0)
        for r in ranges:
            kind, mb, chunk = r.name.split()[:3]
            text = kind + mb[2:] + ("" if chunk == "chunk0" else "." + chunk[5:])
            ax.text((r.start - t0 + r.seconds / 2) * 1e3, y + height / 2, text, ha="center",
                    va="center", fontsize=7, color="white")


def plot_step_trace(tl: Timeline, *, coords: dict[int, tuple[int, ...]] | None = None,
                    title: str = "") -> Figure:
    """One lane per rank over the last step: actions above, communication below."""
    start, end = last_step(tl)
    ranks = list(tl.ranks)
    fig, ax = plt.subplots(figsize=(11, 0.75 * len(ranks) + 1.6), layout="constrained")
    for i, rank in enumerate(ranks):
        y = (len(ranks) - 1 - i) * 1.2
        kinds = classify(tl, rank=rank, window=(start - 1e-4, end))
        for kind in ("F", "B", "W"):
            _bars(ax, kinds[kind], y + 0.45, 0.45, KINDS[kind][1], start, label=True)
        _bars(ax, kinds["tp"], y + 0.22, 0.18, KINDS["tp"][1], start)
        _bars(ax, kinds["pp"], y + 0.0, 0.18, KINDS["pp"][1], start)
        _bars(ax, kinds["wait"], y + 0.0, 0.18, KINDS["wait"][1], start)
        ax.plot([(r.start - start) * 1e3 for r in kinds["dp"]], [y + 0.1] * len(kinds["dp"]),
                "v", color=KINDS["dp"][1], ms=7)
    labels = [f"rank {r}" + (f"\n{coords[r]}" if coords else "") for r in ranks]
    ax.set_yticks([(len(ranks) - 1 - i) * 1.2 + 0.45 for i in range(len(ranks))], labels,
                  fontsize=8)
    ax.set_xlim(0, (end - start) * 1e3 * 1.01)
    ax.set_xlabel("milliseconds since the step's first forward")
    ax.set_title(title or "one training step, rank by rank, from the profiler trace",
                 fontsize=10)
    handles: list[Any] = [Patch(color=KINDS[k][1], label=KINDS[k][2])
                          for k in ("F", "B", "tp", "pp", "wait")]
    handles.append(Line2D([], [], marker="v", ls="", color=KINDS["dp"][1], label=KINDS["dp"][2]))
    ax.legend(handles=handles, loc="upper center", bbox_to_anchor=(0.5, -0.12), ncol=3,
              fontsize=8, frameon=False)
    ax.grid(axis="x", alpha=0.3)
    return fig
