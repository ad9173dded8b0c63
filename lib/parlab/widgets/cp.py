r"""Module 05 widgets and figures: the ring's schedule and who does the causal work.

Same pattern as `parlab.widgets` (compute -> describe -> plot, wired by `Explorer`):

    work_summary(world_size, seq_len, layout) -> summary dict (pure numbers)
    describe_work(summary) -> str (HTML)
    plot_work(summary) -> Figure
    work_explorer(...) -> Explorer: sliders for W and T, a layout dropdown

Work is counted in causal score entries per batch element and head
(`parlab.cp.causal_work`: rank r computes $\sum_{i \in P_r}(i+1)$ of them). The ring's
pace is about the sum over steps of the busiest rank's entries (`ring_pace`); the ideal is the
total split evenly, $\frac{T(T+1)}{2W}$. seq_len is rounded down to a multiple of 2W so that
every layout applies.

`plot_ring_schedule(W)` draws which K/V block each rank holds at each step;
`plot_measured_work(measured)` draws what `parlab.cp.measure_work` counted;
`plot_ring_vs_ulysses(...)` the exposed communication of ring attention and Ulysses per layer
against the sequence length, on two links, for full and grouped-query attention
(`parlab.cp.attention_comm`).
"""

from __future__ import annotations

import ipywidgets as widgets
import matplotlib.pyplot as plt
from matplotlib.axes import Axes
from matplotlib.figure import Figure

from parlab import costs
from parlab.cp.compare import attention_comm
from parlab.cp.layout import LAYOUTS, causal_work, position_table, ring_pace, step_work
from parlab.widgets.explorer import Explorer, Summary

__all__ = ["work_summary", "describe_work", "plot_work", "work_explorer", "plot_ring_schedule",
           "plot_measured_work", "LINKS", "ring_vs_ulysses", "plot_ring_vs_ulysses"]

LINKS = {"NVLink, 450 GB/s per direction": costs.NVLINK_PER_DIRECTION_BYTES_PER_S,
         "400G NIC, 50 GB/s": costs.NIC_400G_BYTES_PER_S}
"""The two links the ring-against-Ulysses figure prices."""

_LAYOUT_COLOURS = {"contiguous": "tab:red", "striped": "tab:blue", "zigzag": "tab:green"}


def work_summary(world_size: int, seq_len: int, layout: str = "contiguous") -> Summary:
    """Per-rank causal work under every layout, and the (rank, step) work of `layout`.

    Keys: "world_size", "seq_len" (rounded down to a multiple of 2W), "requested_seq_len",
    "n" (tokens per rank), "layout", "per_rank" {layout: [entries per rank]},
    "spread" {layout: max - min}, "steps" ((W, W) list, [rank][step]), "pace" {layout: sum over
    steps of the busiest rank}, "ideal" (total / W), "block" (n^2, one full block).
    """
    if world_size < 2:
        raise ValueError(f"world_size must be at least 2, got {world_size}")
    seq = max(2 * world_size, seq_len - seq_len % (2 * world_size))
    tables = {name: position_table(name, world_size, seq) for name in LAYOUTS}
    per_rank = {name: causal_work(t) for name, t in tables.items()}
    steps = {name: step_work(t) for name, t in tables.items()}
    return {
        "world_size": world_size, "seq_len": seq, "requested_seq_len": seq_len,
        "n": seq // world_size, "layout": layout, "per_rank": per_rank,
        "spread": {name: max(w) - min(w) for name, w in per_rank.items()},
        "steps": steps[layout].tolist(), "pace": {n: ring_pace(s) for n, s in steps.items()},
        "ideal": seq * (seq + 1) / 2 / world_size, "block": (seq // world_size) ** 2,
    }


def describe_work(summary: Summary) -> str:
    s = summary
    rounded = (f" (rounded down from {s['requested_seq_len']:,} to a multiple of 2W)"
               if s["seq_len"] != s["requested_seq_len"] else "")
    rows = "".join(
        f"<tr><td>{name}</td><td>{min(w):,}</td><td>{max(w):,}</td>"
        f"<td>{s['spread'][name]:,} ({s['spread'][name] / s['block']:.3g} blocks)</td>"
        f"<td>{s['pace'][name]:,} ({s['pace'][name] / s['ideal']:.2f}&times; ideal)</td></tr>"
        for name, w in s["per_rank"].items())
    return (f"W = {s['world_size']} ranks, T = {s['seq_len']:,} tokens{rounded}, "
            f"n = {s['n']:,} per rank; one n&times;n block = {s['block']:,} entries; ideal "
            f"share T(T+1)/2W = {s['ideal']:,.0f}<br><table><tr><th>layout</th>"
            "<th>least work</th><th>most work</th><th>spread</th><th>ring pace</th></tr>"
            f"{rows}</table>")


def _bars(ax: Axes, per_rank: dict[str, list[int]], ideal: float, title: str) -> None:
    names = list(per_rank)
    world = len(next(iter(per_rank.values())))
    width = 0.8 / len(names)
    for i, name in enumerate(names):
        xs = [r + (i - (len(names) - 1) / 2) * width for r in range(world)]
        ax.bar(xs, per_rank[name], width=width, label=name,
               color=_LAYOUT_COLOURS.get(name, f"C{i}"))
    ax.axhline(ideal, color="black", linestyle="--", linewidth=1, label="even share T(T+1)/2W")
    ax.set_xticks(range(world), [str(r) for r in range(world)])
    ax.set_xlabel("rank")
    ax.set_ylabel("causal score entries computed")
    ax.set_title(title)
    ax.legend(fontsize="small")


def plot_work(summary: Summary) -> Figure:
    """Left: work per rank under each layout. Right: work per (rank, ring step), one layout."""
    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 3.8), layout="constrained",
                                      gridspec_kw={"width_ratios": [3, 2]})
    s = summary
    _bars(left, s["per_rank"], s["ideal"],
          f"Causal work per rank, W = {s['world_size']}, T = {s['seq_len']:,}")
    grid = s["steps"]
    image = right.imshow(grid, cmap="viridis", vmin=0, vmax=s["block"], aspect="auto")
    if s["world_size"] <= 8:
        for r, row in enumerate(grid):
            for step, value in enumerate(row):
                right.text(step, r, f"{value:,}", ha="center", va="center", fontsize=7,
                           color="white" if value < s["block"] / 2 else "black")
    right.set_xticks(range(s["world_size"]))
    right.set_yticks(range(s["world_size"]))
    right.set_xlabel("ring step s (block of rank (r - s) mod W)")
    right.set_ylabel("rank r")
    right.set_title(f"{s['layout']}: entries per step (pace {s['pace'][s['layout']]:,})")
    fig.colorbar(image, ax=right, label="entries (full block = n²)")
    return fig


def work_explorer(world_size: int = 4, seq_len: int = 64,
                  layout: str = "contiguous") -> Explorer:
    """Sliders for W and T and a layout dropdown over `work_summary` (keys of `.controls`:
    "world_size", "seq_len", "layout")."""
    style = {"description_width": "10em"}
    controls = {
        "world_size": widgets.IntSlider(value=world_size, min=2, max=16, description="ranks W",
                                        continuous_update=False, style=style),
        "seq_len": widgets.IntSlider(value=seq_len, min=8, max=4096, step=8,
                                     description="sequence length T", continuous_update=False,
                                     style=style, layout=widgets.Layout(width="36em")),
        "layout": widgets.Dropdown(options=list(LAYOUTS), value=layout,
                                   description="layout (right)", style=style),
    }
    return Explorer(controls, work_summary, describe_work, plot_work)


def plot_ring_schedule(world_size: int = 4) -> Figure:
    """Which K/V block rank r holds at step s: block (r - s) mod W, coloured by its owner."""
    fig, ax = plt.subplots(figsize=(1.3 * world_size + 2.2, 0.55 * world_size + 1.4),
                           layout="constrained")
    for r in range(world_size):
        for s in range(world_size):
            src = (r - s) % world_size
            ax.add_patch(plt.Rectangle((s, r), 0.92, 0.84, color=f"C{src}", alpha=0.8))
            ax.text(s + 0.46, r + 0.42, f"K{src} V{src}", ha="center", va="center",
                    fontsize=9, color="white")
            if s + 1 < world_size and r + 1 < world_size:  # rank W-1 passes to rank 0
                ax.annotate("", xy=(s + 1.05, (r + 1) % world_size + 0.42),
                            xytext=(s + 0.9, r + 0.42),
                            arrowprops={"arrowstyle": "->", "color": "grey", "lw": 0.8})
    ax.set_xlim(-0.1, world_size)
    ax.set_ylim(world_size, -0.1)
    ax.set_xticks([s + 0.46 for s in range(world_size)],
                  [f"step {s}" for s in range(world_size)])
    ax.set_yticks([r + 0.42 for r in range(world_size)],
                  [f"rank {r} (Q{r})" for r in range(world_size)])
    ax.set_title(f"Ring of {world_size}: at step s rank r computes with block (r - s) mod W\n"
                 "and passes it on to rank r + 1 (arrows; rank W-1 passes to rank 0)")
    ax.tick_params(length=0)
    for side in ax.spines.values():
        side.set_visible(False)
    return fig


def plot_measured_work(measured: dict) -> Figure:
    """Per-rank work that `measure_work` counted, per layout, with the even share."""
    per_rank = {name: [int(x) for x in m["per_rank"]] for name, m in measured.items()}
    table = next(iter(measured.values()))["table"]
    world, n = table.shape
    seq = world * n
    fig, ax = plt.subplots(figsize=(7, 3.6), layout="constrained")
    _bars(ax, per_rank, seq * (seq + 1) / 2 / world,
          f"Measured: causal entries each rank's blocks evaluated (W = {world}, T = {seq})")
    return fig


def ring_vs_ulysses(seqs: list[int], *, heads: int, head_dim: int, world_size: int,
                    kv_heads: int | None = None, bandwidth: float,
                    flops: float = costs.H100_BF16_FLOPS) -> dict[str, list[float]]:
    """Per layer, forward and backward, one sequence, causal: seconds of communication that
    ring attention and Ulysses leave exposed, for each sequence length in `seqs`."""
    rows = [attention_comm(b=1, s=s, heads=heads, head_dim=head_dim, c=world_size,
                           flops=flops, bandwidth=bandwidth, kv_heads=kv_heads, backward=True)
            for s in seqs]
    return {"ring": [float(r["ring_exposed_s"]) for r in rows],
            "ulysses": [float(r["ulysses_exposed_s"]) for r in rows]}


def plot_ring_vs_ulysses(*, heads: int = 64, head_dim: int = 128, world_size: int = 8,
                         kv_heads: int = 8, seqs: list[int] | None = None) -> Figure:
    """Exposed communication per layer (forward and backward, ms) against the sequence length,
    ring and Ulysses, full attention and grouped-query (`kv_heads`), one panel per link."""
    seqs = seqs or [2 ** k for k in range(13, 21)]
    fig, axes = plt.subplots(1, len(LINKS), figsize=(12, 4), sharey=True, layout="constrained")
    for ax, (link, bw) in zip(axes, LINKS.items(), strict=True):
        for kv, style in ((heads, "-"), (kv_heads, "--")):
            got = ring_vs_ulysses(seqs, heads=heads, head_dim=head_dim, world_size=world_size,
                                  kv_heads=kv, bandwidth=bw)
            what = "MHA" if kv == heads else f"GQA, {kv} K/V heads"
            for kind, colour in (("ring", "tab:blue"), ("ulysses", "tab:orange")):
                ms = [x * 1e3 if x > 0 else float("nan") for x in got[kind]]
                ax.plot(seqs, ms, style, color=colour, marker="o", markersize=3,
                        label=f"{'ring' if kind == 'ring' else 'Ulysses'} ({what})")
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xlabel(f"sequence length T (tokens), over W = {world_size} ranks")
        ax.set_title(link)
        ax.grid(True, which="major", alpha=0.3)
    axes[0].set_ylabel("exposed communication per layer (ms)")
    axes[0].legend(fontsize="small")
    fig.suptitle(f"Ring attention against Ulysses: {heads} heads of {head_dim}, causal, bf16, "
                 f"one sequence, {costs.H100_BF16_FLOPS / 1e12:,.0f} TFLOP/s")
    return fig
