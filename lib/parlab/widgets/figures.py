r"""Pictures of the collectives, for module 00 (matplotlib; every figure titled and labelled).

    draw_collective(kind, t=4) -> Figure      ranks as rows of boxes, before -> after
    draw_ring_allreduce(t=4) -> Figure        the ring, then the chunks after every step
    plot_allreduce_time(sizes, ...) -> Figure alpha-beta time of a ring all-reduce vs t

Box labels: rank r's data is named by a letter (rank 0 "a", rank 1 "b", ...); "a2" is the
third of rank 0's t chunks. A sum over every rank of chunk j is written "Σ2" (j = 2). Colours
follow the rank a piece came from; sums are grey.
"""

from __future__ import annotations

from collections.abc import Sequence

import matplotlib.pyplot as plt
from matplotlib.axes import Axes
from matplotlib.figure import Figure
from matplotlib.patches import Circle, FancyArrowPatch, Rectangle

from parlab import costs

KINDS = ("all_reduce", "reduce_scatter", "all_gather", "all_to_all", "broadcast", "send_recv")
TITLES = {
    "all_reduce": "all-reduce: every rank ends with the element-wise sum over all ranks",
    "reduce_scatter": "reduce-scatter: rank j ends with chunk j of the sum",
    "all_gather": "all-gather: every rank ends with every rank's piece",
    "all_to_all": "all-to-all: chunk j of rank i goes to rank j (a transpose)",
    "broadcast": "broadcast: rank 0's tensor is copied to every rank",
    "send_recv": "send/recv: rank 0 sends, rank 1 receives a copy",
}
CALLS = {
    "all_reduce": "dist.all_reduce(x)",
    "reduce_scatter": "dist.reduce_scatter(out, list(x.tensor_split(t)))",
    "all_gather": "dist.all_gather(list_of_t_outputs, x)",
    "all_to_all": "dist.all_to_all_single(out, x)",
    "broadcast": "dist.broadcast(x, src=0)",
    "send_recv": "rank 0: dist.send(x, dst=1)   rank 1: dist.recv(x, src=0)",
}
SUM = -1  # colour key of a complete sum (grey); a rank's own pieces use the rank number
Box = tuple[str, int] | None  # (label, colour key: a rank or SUM), None = nothing there
Grid = list[list[Box]]  # [rank][slot]
MAX_WIDTH_IN = 10.0  # a notebook shows about 10 inches at 100 dpi without scaling the figure down


def _letter(rank: int) -> str:
    return "abcdefghijklmnopqrstuvwxyz"[rank % 26]


def _colour(key: int) -> str | tuple[float, float, float, float]:
    if key == SUM:
        return "0.78"
    return plt.get_cmap("tab10")(key % 10)


def collective_states(kind: str, t: int = 4) -> tuple[Grid, Grid]:
    """What every rank holds before and after `kind`, as [rank][slot] boxes."""
    if kind not in KINDS:
        raise ValueError(f"kind must be one of {', '.join(KINDS)}; got {kind!r}")
    if kind == "send_recv":
        return [[("a", 0)], [None]], [[("a", 0)], [("a", 0)]]
    if kind == "broadcast":
        first: list[Box] = [("a", 0)]
        before: Grid = [first] + [[None] for _ in range(1, t)]
        return before, [[("a", 0)] for _ in range(t)]
    full: Grid = [[(f"{_letter(r)}{j}", r) for j in range(t)] for r in range(t)]
    total: list[Box] = [(f"Σ{j}", SUM) for j in range(t)]
    if kind == "all_reduce":
        return full, [list(total) for _ in range(t)]
    if kind == "reduce_scatter":
        return full, [[total[j] if j == r else None for j in range(t)] for r in range(t)]
    if kind == "all_gather":
        own: Grid = [[(_letter(r), r) if j == r else None for j in range(t)] for r in range(t)]
        gathered: Grid = [[(_letter(j), j) for j in range(t)] for _ in range(t)]
        return own, gathered
    # all_to_all: rank r's chunk j is for rank j; rank r ends with every rank's chunk r
    moved: Grid = [[(f"{_letter(j)}{r}", j) for j in range(t)] for r in range(t)]
    return full, moved


def _draw_grid(ax: Axes, grid: Grid, title: str, *,
               bold: frozenset[tuple[int, int]] | set[tuple[int, int]] = frozenset(),
               fontsize: float = 10, ranks: bool = True, chunks: bool = True) -> None:
    rows, cols = len(grid), max(len(row) for row in grid)
    for r, row in enumerate(grid):
        for j, box in enumerate(row):
            y = rows - 1 - r  # rank 0 on top
            if box is None:
                ax.add_patch(Rectangle((j + 0.05, y + 0.1), 0.9, 0.8, fill=False,
                                       linestyle=":", edgecolor="0.6"))
                continue
            label, key = box
            edge = "tab:red" if (r, j) in bold else "black"
            ax.add_patch(Rectangle((j + 0.05, y + 0.1), 0.9, 0.8, facecolor=_colour(key),
                                   edgecolor=edge, linewidth=2.5 if (r, j) in bold else 0.8,
                                   alpha=0.9))
            ax.text(j + 0.5, y + 0.5, label, ha="center", va="center", fontsize=fontsize)
    ax.set_xlim(0, cols)
    ax.set_ylim(0, rows)
    if ranks:
        ax.set_yticks([rows - 1 - r + 0.5 for r in range(rows)],
                      [f"rank {r}" for r in range(rows)])
    else:
        ax.set_yticks([])
    if cols > 1 and chunks:
        ax.set_xticks([j + 0.5 for j in range(cols)], [str(j) for j in range(cols)])
        ax.set_xlabel("chunk")
    else:
        ax.set_xticks([])
    ax.tick_params(length=0, labelsize=10)
    for side in ax.spines.values():
        side.set_visible(False)
    ax.set_title(title, fontsize=10)


def draw_collective(kind: str, t: int = 4) -> Figure:
    """Before -> after boxes for one collective on t ranks (send_recv always uses 2)."""
    before, after = collective_states(kind, t)
    rows, cols = len(before), len(before[0])
    width = min(MAX_WIDTH_IN, 2.2 + 1.1 * cols * 2)
    fig, (ax0, ax1) = plt.subplots(1, 2, figsize=(width, 1.3 + 0.55 * rows),
                                   layout="constrained")
    _draw_grid(ax0, before, "before")
    _draw_grid(ax1, after, "after")
    fig.suptitle(TITLES[kind], fontsize=11)
    note = f"call: {CALLS[kind]}"
    if cols > 1 and kind != "all_gather":
        note += f"    ·    a{cols - 1} = chunk {cols - 1} of rank 0's tensor"
    if kind in ("all_reduce", "reduce_scatter"):
        note += "    ·    Σj = " + " + ".join(f"{_letter(r)}j" for r in range(rows))
    fig.text(0.5, -0.02, note, ha="center", va="top", fontsize=9, family="monospace")
    return fig


Held = list[list[frozenset[int]]]  # [rank][chunk] -> the ranks whose values it sums


def ring_allreduce_states(t: int) -> list[tuple[str, Held, set[tuple[int, int]]]]:
    """Symbolic ring all-reduce: after each step, the set of ranks summed in every chunk.

    Step s of the reduce-scatter: rank r sends chunk (r - s) % t to rank r + 1, which adds it
    into its own copy. Step s of the all-gather: rank r sends the finished chunk
    (r + 1 - s) % t, which rank r + 1 copies. Returns (title, held[rank][chunk], updated boxes).
    """
    held: Held = [[frozenset({r}) for _ in range(t)] for r in range(t)]
    out: list[tuple[str, Held, set[tuple[int, int]]]] = [("start", [row[:] for row in held],
                                                           set())]
    for phase in ("reduce-scatter", "all-gather"):
        for s in range(t - 1):
            sent = [(r, (r - s) % t if phase == "reduce-scatter" else (r + 1 - s) % t)
                    for r in range(t)]
            new = [row[:] for row in held]
            for r, c in sent:
                dst = (r + 1) % t
                new[dst][c] = held[dst][c] | held[r][c] if phase == "reduce-scatter" \
                    else held[r][c]
            held = new
            out.append((f"{phase} step {s + 1}", [row[:] for row in held],
                        {((r + 1) % t, c) for r, c in sent}))
    return out


def _draw_ring(ax: Axes, t: int) -> None:
    import math

    angles = [math.pi / 2 - 2 * math.pi * r / t for r in range(t)]  # clockwise from the top
    pos = [(math.cos(a), math.sin(a)) for a in angles]
    for r, (x, y) in enumerate(pos):
        ax.add_patch(Circle((x, y), 0.3, facecolor=_colour(r), edgecolor="black"))
        ax.text(x, y, str(r), ha="center", va="center", fontsize=12)
        nx, ny = pos[(r + 1) % t]
        ax.add_patch(FancyArrowPatch((x, y), (nx, ny), arrowstyle="-|>", mutation_scale=14,
                                     shrinkA=16, shrinkB=16, connectionstyle="arc3,rad=0.2"))
    ax.set_xlim(-1.5, 1.5)
    ax.set_ylim(-1.5, 1.5)
    ax.set_aspect("equal")
    ax.axis("off")
    ax.set_title("the ring: rank r\nsends to rank r+1", fontsize=10)


def _ring_label(ranks: frozenset[int], t: int) -> str:
    return "Σ" if len(ranks) == t else "".join(map(str, sorted(ranks)))


def draw_ring_allreduce(t: int = 4) -> Figure:
    """The ring, then each rank's chunks after every one of the 2(t-1) steps: the start and the
    reduce-scatter steps in the top row, the all-gather steps below, at most 10 inches wide so
    that a notebook shows the labels at their size (10 pt)."""
    states = ring_allreduce_states(t)
    cols = t + 1  # the ring, then the start and t-1 reduce-scatter steps
    width = min(MAX_WIDTH_IN, 1.9 + 0.42 * t * t)
    fig = plt.figure(figsize=(width, 2 * (0.45 * t + 1.0) + 0.9), layout="constrained")
    grid = fig.add_gridspec(2, cols, width_ratios=[1.3] + [1.0] * t)
    _draw_ring(fig.add_subplot(grid[:, 0]), t)
    panels = [(0, c) for c in range(1, cols)] + [(1, c) for c in range(2, cols)]
    for (row, col), (title, held, updated) in zip(panels, states, strict=True):
        ax = fig.add_subplot(grid[row, col])
        boxes: Grid = [[(_ring_label(ranks, t), SUM if len(ranks) == t else min(ranks))
                        for ranks in line] for line in held]
        _draw_grid(ax, boxes, title.replace(" step", "\nstep"), bold=updated,
                   fontsize=10 if t <= 4 else 8, ranks=col == 1 or (row == 1 and col == 2),
                   chunks=row == 1 or col == 1)
    fig.suptitle(f"Ring all-reduce on {t} ranks: {t - 1} reduce-scatter steps (top), then "
                 f"{t - 1} all-gather steps (bottom)\nA box lists the ranks whose values it "
                 "sums; Σ: the complete sum (grey); red outline: just received from the left",
                 fontsize=11)
    return fig


def plot_allreduce_time(sizes: Sequence[float], *, alpha: float, bandwidth: float,
                        t_max: int = 64) -> Figure:
    """Ring all-reduce time (alpha-beta model) against t for a few message sizes, log scales.

    Dashed: the bandwidth floor 2n/beta that the time approaches as t grows.
    """
    fig, ax = plt.subplots(figsize=(6.4, 4.0), layout="constrained")
    ts = list(range(2, t_max + 1))
    for i, n in enumerate(sizes):
        colour = plt.get_cmap("tab10")(i)
        times = [costs.ring_allreduce_time(n, t, alpha=alpha, bandwidth=bandwidth) for t in ts]
        ax.plot(ts, times, color=colour, label=f"n = {_bytes(n)}")
        ax.axhline(2 * n / bandwidth, color=colour, linestyle="--", linewidth=0.8)
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xlabel("ranks in the ring, t")
    ax.set_ylabel("time of one all-reduce (s)")
    ax.set_title(f"Ring all-reduce, α = {alpha * 1e6:g} µs, β = {bandwidth / 1e9:g} GB/s "
                 "(dashed: 2n/β)")
    ax.legend(fontsize="small")
    ax.grid(True, which="major", alpha=0.3)
    return fig


def _bytes(n: float) -> str:
    for unit, size in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if n >= size:
            return f"{n / size:g} {unit}"
    return f"{n:g} B"
