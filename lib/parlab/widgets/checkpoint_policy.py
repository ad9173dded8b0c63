r"""Module 09's checkpoint policy: the interval against the failure rate, sync or async saves.

    policy_explorer()                      # sliders: MTBF, save times, restart; both curves
    plot_policy(policy_summary(3.0, 60, 4, 90, 600))       # the same figure, no widgets
    plot_save_stalls(run(measure, 2, ...))                 # a measured save, rank by rank

Every number comes from `parlab.costs.checkpointing`: the overhead
(δ + max(0, w - τ))/τ + (τ/2 + w + R)/M of a save every τ seconds, for a synchronous save
(δ = the whole save, w = 0) and an asynchronous one (δ = the staging copy, w = the background
write), and each mode's best interval.
"""

from __future__ import annotations

from typing import Any, Literal

import matplotlib.pyplot as plt
from matplotlib.axes import Axes
from matplotlib.figure import Figure

from parlab import costs
from parlab.widgets.explorer import Explorer, Summary, log_slider

__all__ = ["policy_summary", "describe_policy", "plot_policy", "policy_explorer",
           "plot_save_stalls"]

COLOURS = {"sync": "tab:red", "async": "tab:blue"}


def policy_summary(mtbf_h: float, sync_save_s: float, async_stall_s: float,
                   async_write_s: float, restart_s: float) -> Summary:
    """Both modes' overhead curves over τ (seconds), their best intervals, and the winner."""
    m = mtbf_h * 3600
    args = {"mtbf": m, "sync_save": sync_save_s, "async_stall": async_stall_s,
            "async_write": async_write_s, "restart": restart_s}
    taus = [m * 1e-3 * 1e4 ** (i / 399) for i in range(400)]  # 1e-3 M .. 10 M
    out: Summary = {"mtbf": m, **args, "taus": taus, "curves": {}, "best": {}}
    modes: tuple[tuple[Literal["sync", "async"], float, float], ...] = (
        ("sync", sync_save_s, 0.0), ("async", async_stall_s, async_write_s))
    for mode, delta, w in modes:
        out["curves"][mode] = [costs.policy_overhead(mode, t, **args) for t in taus]
        tau = costs.best_interval(mtbf=m, save_stall=delta, write=w)
        out["best"][mode] = (tau, costs.policy_overhead(mode, tau, **args))
    out["winner"] = costs.best_policy(**args)
    return out


def describe_policy(summary: Summary) -> str:
    best, win = summary["best"], summary["winner"]
    parts = [f"<b>{mode}</b>: every {tau / 60:,.1f} min, {cost:.2%} of the time lost"
             for mode, (tau, cost) in best.items()]
    return (f"MTBF {summary['mtbf'] / 3600:,.2f} h, restart {summary['restart']:,.0f} s. "
            + "; ".join(parts) + f". Best: <b>{win.mode}</b>.")


def plot_policy(summary: Summary, ax: Axes | None = None) -> Figure:
    """Overhead (share of time lost) against the interval, one curve per mode, each mode's best
    interval marked."""
    if ax is None:
        fig, ax = plt.subplots(figsize=(7.2, 4.0), layout="constrained")
    else:
        root = ax.figure
        fig = root if isinstance(root, Figure) else root.get_figure(root=True)
    minutes = [t / 60 for t in summary["taus"]]
    top = max(summary["best"], key=lambda k: summary["best"][k][1])  # labelled above its dot
    for mode, curve in summary["curves"].items():
        label = ("sync: δ = the whole save" if mode == "sync" else
                 "async: δ = the copy, + wait and w/M")
        ax.plot(minutes, [100 * c for c in curve], color=COLOURS[mode], label=label)
        tau, cost = summary["best"][mode]
        ax.plot([tau / 60], [100 * cost], "o", color=COLOURS[mode])
        ax.annotate(f"{mode} best: {tau / 60:,.1f} min, {cost:.1%}", (tau / 60, 100 * cost),
                    xytext=(6, 8 if mode == top else -14), textcoords="offset points",
                    fontsize=8, color=COLOURS[mode])
    if summary["async_write"] > 0:
        ax.axvline(summary["async_write"] / 60, color="grey", linestyle=":",
                   label=f"w = {summary['async_write']:,.0f} s (async write)")
    floor = min(cost for _, cost in summary["best"].values())
    ax.set_xscale("log")
    ax.set_ylim(0, min(100.0, 100 * floor * 4))
    ax.set_xlabel("interval τ between saves (minutes of training, log scale)")
    ax.set_ylabel("time lost (% of training time)")
    ax.set_title(f"Save stalls + lost work + restarts, a failure every "
                 f"{summary['mtbf'] / 3600:,.2f} h (R = {summary['restart']:,.0f} s)",
                 fontsize=10)
    ax.legend(loc="upper right", fontsize=8)
    ax.grid(alpha=0.3)
    return fig


def policy_explorer(mtbf_h: float = 54 * 24 / 419, sync_save_s: float = 60.0,
                    async_stall_s: float = 4.0, async_write_s: float = 90.0,
                    restart_s: float = 600.0) -> Explorer:
    """Sliders for the MTBF (hours), the two save modes' times and the restart (seconds)."""
    controls = {
        "mtbf_h": log_slider("MTBF (hours)", mtbf_h, 10, -1, 2.5, 0.01, ",.3g"),
        "sync_save_s": log_slider("sync save δ (s)", sync_save_s, 10, 0, 3, 0.01, ",.3g"),
        "async_stall_s": log_slider("async copy δ (s)", async_stall_s, 10, -1, 2.5, 0.01,
                                    ",.3g"),
        "async_write_s": log_slider("async write w (s)", async_write_s, 10, 0, 3.5, 0.01,
                                    ",.3g"),
        "restart_s": log_slider("restart R (s)", restart_s, 10, 0, 3.5, 0.01, ",.3g"),
    }
    return Explorer(controls, policy_summary, describe_policy, plot_policy)


def plot_save_stalls(measured: list[dict[str, Any]]) -> Figure:
    """A measured save per rank (`parlab.compose.measure_save_stalls`'s medians): how long the
    training loop was blocked by a sync and by an async save, and how long the async write ran
    behind the training."""
    fig, ax = plt.subplots(figsize=(7.2, 1.3 + 0.9 * len(measured)), layout="constrained")
    rows, labels = 0, []
    for rank, r in enumerate(measured):
        ms = {k: 1e3 * r[k] for k in ("sync", "async_stall", "async_write")}
        ax.barh(rows, ms["sync"], color=COLOURS["sync"],
                label="loop blocked: sync save" if rank == 0 else None)
        ax.barh(rows + 1, ms["async_stall"], color=COLOURS["async"],
                label="loop blocked: async copy" if rank == 0 else None)
        ax.barh(rows + 1, ms["async_write"], left=ms["async_stall"], color="lightgrey",
                hatch="//", edgecolor="grey",
                label="async write, behind the training" if rank == 0 else None)
        for y, value in ((rows, ms["sync"]), (rows + 1, ms["async_stall"])):
            ax.annotate(f"{value:,.0f} ms", (value, y), xytext=(3, -3),
                        textcoords="offset points", fontsize=8)
        labels += [f"rank {rank}, sync", f"rank {rank}, async"]
        rows += 2
    ax.set_yticks(range(rows), labels, fontsize=8)
    ax.invert_yaxis()
    ax.set_xlabel("milliseconds from the start of the save")
    ax.set_title("Measured on this machine: the training loop's stall per save", fontsize=10)
    ax.legend(loc="upper center", bbox_to_anchor=(0.5, -0.3), ncol=3, fontsize=8)
    return fig
