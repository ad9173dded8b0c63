r"""Module 01's pictures of the course's FSDP layer beside PyTorch's FSDP2 (matplotlib).

    plot_shard_owners(out_features, in_features, t) -> Figure
        [W | b] of one nn.Linear as a grid, each element coloured by the rank that holds it:
        the course's flat shards (parlab.dp.owners_flat) beside FSDP2's rows
        (parlab.dp.owners_dim0), with the padding each rank's storage carries written under.
    plot_step_bytes(rows) -> Figure
        the bytes one rank sends in a step, split into forward all-gather, backward
        all-gather and reduce-scatter, one bar per measured row, the closed form as a mark.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import matplotlib.pyplot as plt
from matplotlib.colors import ListedColormap
from matplotlib.figure import Figure

from parlab.dp import dim0_rows, owners_dim0, owners_flat

__all__ = ["plot_shard_owners", "plot_step_bytes", "PARTS"]

PARTS = ("forward all-gather", "backward all-gather", "reduce-scatter")
_COLOURS = ["#4C72B0", "#DD8452", "#55A868", "#C44E52", "#8172B3", "#937860", "#DA8BC3",
            "#8C8C8C"]


def _padding_note(out_features: int, in_features: int, t: int) -> tuple[str, str]:
    p = out_features * (in_features + 1)
    n = math.ceil(p / t)
    flat = f"each rank n = ceil({p}/{t}) = {n} elements; padding: {t * n - p} elements"
    c = math.ceil(out_features / t)
    short = [f"rank {r}: {c - (e - s)}" for r, (s, e) in
             enumerate(dim0_rows(out_features, t)) if e - s < c]
    rows = (f"each rank ceil({out_features}/{t}) = {c} rows of W and of b; padding rows "
            + (", ".join(short) if short else "none"))
    return flat, rows


def plot_shard_owners(out_features: int, in_features: int, t: int) -> Figure:
    """Which rank holds each element of [W | b]: the course's layer against FSDP2."""
    grids = (owners_flat(out_features, in_features, t), owners_dim0(out_features, in_features, t))
    notes = _padding_note(out_features, in_features, t)
    titles = ("your FSDPLinear: the flat vector [vec W; b] cut in t pieces",
              "FSDP2 (fully_shard): W and b each cut by rows, Shard(0)")
    cmap = ListedColormap(_COLOURS[:t])
    fig, axes = plt.subplots(1, 2, figsize=(11, 0.45 * out_features + 1.9), squeeze=False)
    for ax, grid, title, note in zip(axes[0], grids, titles, notes, strict=True):
        ax.imshow(grid.numpy(), cmap=cmap, vmin=-0.5, vmax=t - 0.5, aspect="auto")
        for (i, j), rank in ((ij, int(grid[ij])) for ij in
                             ((i, j) for i in range(out_features)
                              for j in range(in_features + 1))):
            ax.text(j, i, str(rank), ha="center", va="center", fontsize=8, color="white")
        ax.axvline(in_features - 0.5, color="black", linewidth=2)
        ax.set_xticks([*range(0, in_features, max(1, in_features // 4)), in_features])
        ax.set_xticklabels([*(f"W[:, {j}]" for j in range(0, in_features,
                                                           max(1, in_features // 4))), "b"])
        ax.set_ylabel("row (output feature)")
        ax.set_title(title, fontsize=10)
        ax.set_xlabel(note, fontsize=9)
    fig.suptitle(f"nn.Linear({in_features}, {out_features}) on {t} ranks: the number (and "
                 "colour) is the rank holding each element", fontsize=11)
    fig.tight_layout()
    return fig


def plot_step_bytes(rows: Sequence[dict]) -> Figure:
    """Bars of the bytes one rank sends per step, split by PARTS; each row a dict with
    "label", the three PARTS (measured bytes) and "model" (the closed form's total)."""
    fig, ax = plt.subplots(figsize=(max(7.0, 1.3 * len(rows) + 3.5), 4))
    bottoms = [0.0] * len(rows)
    for part, colour in zip(PARTS, _COLOURS, strict=False):
        heights = [float(r.get(part, 0.0)) for r in rows]
        ax.bar(range(len(rows)), heights, bottom=bottoms, color=colour, label=part)
        bottoms = [b + h for b, h in zip(bottoms, heights, strict=True)]
    ax.scatter(range(len(rows)), [r["model"] for r in rows], marker="_", s=900, color="black",
               zorder=3, label="closed form")
    ax.set_xticks(range(len(rows)))
    ax.set_xticklabels([r["label"] for r in rows], fontsize=9)
    ax.set_ylabel("bytes sent by one rank per step")
    ax.set_title("One training step, measured by parlab.comm's tracer", fontsize=11)
    ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    fig.tight_layout()
    return fig
