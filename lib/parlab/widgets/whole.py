r"""Module 08 widgets: the 3D rank grid with its links, and memory per GPU as recomputation and
ZeRO change.

Same pattern as `parlab.widgets` (Explorer):

    grid_summary(dp, pp, tp, gpus_per_node, cp=1) -> summary (ranks, coordinates, groups, links)
    describe_grid(summary) -> str (HTML)        plot_grid(summary) -> Figure
    grid_explorer(...) -> Explorer

Every rank is a square labelled with its number and its (dp, pp, tp) coordinates (cp too when
used), in a row inside the box of its node; nodes stand side by side, in as many rows as keep
the figure within MAX_WIDTH_IN (wider, a notebook would shrink it and its labels). Ranks are
consecutive in TP, then CP, then PP, then DP (`parlab.mesh`, TP innermost). A TP group is
outlined (dashed where it is cut by a node boundary); PP and CP neighbours are joined by arcs
above the row, DP neighbours by arcs below, solid when the two ranks share a node (NVLink),
dashed when they do not (the network).
The legend says, per axis, the link and how many nodes a group spans.

    memory_summary_3d(tp, pp, cp, micro_batch, strategy, recompute, model=..., cluster=...,
                      global_batch=...) -> summary     (numbers from parlab.plan's cost model)
    describe_memory_3d(summary) -> str          plot_memory_3d(summary) -> Figure
    memory_explorer_3d(...) -> Explorer

The memory figure has one group of bars per recomputation policy (none, selective, full) and
one stacked bar per ZeRO strategy inside it (ddp, zero1, zero3), split into weights,
gradients, optimizer state (and ZeRO-3's gathered weights) and activations of the first
pipeline stage, against the usable share of the GPU's memory; the chosen pair is outlined.
DP is what the cluster leaves: dp = GPUs / (tp·pp·cp).
"""

from __future__ import annotations

import math
from typing import Any

import ipywidgets as widgets
import matplotlib.pyplot as plt
from matplotlib.figure import Figure
from matplotlib.lines import Line2D
from matplotlib.patches import FancyArrowPatch, FancyBboxPatch, Patch, Rectangle

from parlab import costs
from parlab import plan as planner
from parlab.mesh import make_mesh
from parlab.widgets.explorer import Explorer, Summary

AXIS_COLOURS = {"tp": "black", "cp": "tab:purple", "pp": "tab:red", "dp": "tab:blue"}
TP_FILLS = ("#dbe9f6", "#fde2c8", "#d8f0d2", "#f2d7e6", "#e8e1f5", "#fff2b3", "#d9f2f2",
            "#f0e0d0")
_GAP = 0.9  # space between node boxes, in rank squares
MAX_WIDTH_IN = 9.5  # a notebook shows a figure this wide at its own size: no smaller type
_INCH_PER_RANK = 0.75  # the width of one rank's square, so that its labels fit


def grid_summary(dp: int, pp: int, tp: int, gpus_per_node: int, cp: int = 1) -> Summary:
    """Keys: the inputs; "world", "nodes"; "ranks" [{rank, coords, node}]; "groups" {axis:
    [[ranks]]}; "links" {axis: (link name, most nodes a group spans)} for axes of size > 1."""
    world = dp * pp * tp * cp
    if world % gpus_per_node and world > gpus_per_node:
        raise ValueError(f"{world} ranks do not fill nodes of {gpus_per_node}: pick sizes whose "
                         "product is a multiple of the GPUs per node")
    mesh = make_mesh(world, dp=dp, pp=pp, tp=tp, cp=cp)
    ranks = [{"rank": r, "coords": mesh.coords(r), "node": r // gpus_per_node}
             for r in range(world)]
    groups = {axis: mesh.groups(axis) for axis in ("tp", "cp", "pp", "dp")
              if mesh.sizes[axis] > 1}
    links = {}
    for axis, lines in groups.items():
        span = max(len({r // gpus_per_node for r in line}) for line in lines)
        links[axis] = ("NVLink" if span == 1 else "network", span)
    return {"dp": dp, "pp": pp, "tp": tp, "cp": cp, "gpus_per_node": gpus_per_node,
            "world": world, "nodes": math.ceil(world / gpus_per_node), "ranks": ranks,
            "groups": groups, "links": links}


def describe_grid(s: Summary) -> str:
    axes = ", ".join(f"{a.upper()} {s[a]} on {link}" + (f" (spans {n} nodes)" if n > 1 else "")
                     for a, (link, n) in s["links"].items())
    return (f"<b>{s['world']} ranks</b> in {s['nodes']} node(s) of {s['gpus_per_node']}: "
            f"{axes or 'one rank'}. TP innermost: a TP group of up to {s['gpus_per_node']} "
            "consecutive ranks stays inside a node.")


def _per_row(s: Summary) -> int:
    """Nodes side by side in one row of the figure: as many as fit MAX_WIDTH_IN."""
    width = (MAX_WIDTH_IN - 1) / _INCH_PER_RANK  # in rank squares
    return max(1, min(s["nodes"], int((width + _GAP) // (s["gpus_per_node"] + _GAP))))


def _xy(rank: int, s: Summary) -> tuple[float, float]:
    """Bottom left corner of a rank's square: nodes side by side, rows of nodes downwards."""
    node, slot = divmod(rank, s["gpus_per_node"])
    row, col = divmod(node, _per_row(s))
    return col * (s["gpus_per_node"] + _GAP) + slot, -row * s.get("row_height", 0.0)


def _label(coords: dict[str, int], cp: bool) -> str:
    names = ("dp", "pp", "cp", "tp") if cp else ("dp", "pp", "tp")
    return "(" + ",".join(str(coords[n]) for n in names) + ")"


def _arc(ax: Any, a: int, b: int, s: Summary, axis: str) -> None:
    """A curved line from rank a to rank b: PP, CP above the row, DP below; row to row."""
    (xa, ya), (xb, yb) = _xy(a, s), _xy(b, s)
    above = axis != "dp"
    if ya == yb:
        y = 0.8 if above else 0.0
        start, end, rad = (xa + 0.4, ya + y), (xb + 0.4, yb + y), -0.35 if above else 0.35
    else:
        (xt, yt), (xl, yl) = ((xa, ya), (xb, yb)) if ya > yb else ((xb, yb), (xa, ya))
        start, end, rad = (xt + 0.4, yt), (xl + 0.4, yl + 0.8), 0.1
    same = a // s["gpus_per_node"] == b // s["gpus_per_node"]
    ax.add_patch(FancyArrowPatch(start, end, arrowstyle="-", mutation_scale=8,
                                 connectionstyle=f"arc3,rad={rad}", color=AXIS_COLOURS[axis],
                                 lw=1.5, ls="-" if same else "--"))


def plot_grid(s: Summary) -> Figure:
    """Nodes, ranks with coordinates, TP groups outlined, PP/CP/DP groups joined by arcs."""
    g, per_row = s["gpus_per_node"], _per_row(s)
    span = per_row * (g + _GAP) - _GAP

    def reach(axes: tuple[str, ...]) -> float:  # how far the widest arc bends (rad 0.35)
        pairs = [(a, b) for axis in axes for line in s["groups"].get(axis, [])
                 for a, b in zip(line, line[1:], strict=False)]
        return max((0.18 * abs(_xy(b, s)[0] - _xy(a, s)[0]) for a, b in pairs), default=0.0)

    low, high = -max(1.2, 0.3 + reach(("dp",))), max(1.9, 1.1 + reach(("pp", "cp")))
    s = {**s, "row_height": high - low}
    rows = math.ceil(s["nodes"] / per_row)
    fig, ax = plt.subplots(figsize=(max(6.5, _INCH_PER_RANK * span + 1),
                                    1.0 + 0.75 * (high - low) * rows), layout="constrained")
    for node in range(s["nodes"]):
        x0, y0 = _xy(node * g, s)
        ax.add_patch(FancyBboxPatch((x0 - 0.25, y0 - 0.35), g + 0.3, 1.5,
                                    boxstyle="round,pad=0.05", fc="#f4f4f4", ec="grey", lw=1))
        ax.text(x0 - 0.2, y0 + 1.0, f"node {node}", ha="left", fontsize=8, color="grey")
    tp_lines = s["groups"].get("tp", [[r["rank"]] for r in s["ranks"]])
    tp_of = {r: i for i, line in enumerate(tp_lines) for r in line}
    for r in s["ranks"]:
        x, y = _xy(r["rank"], s)
        ax.add_patch(Rectangle((x, y), 0.8, 0.8, fc=TP_FILLS[tp_of[r["rank"]] % len(TP_FILLS)],
                               ec="grey", lw=0.8))
        ax.text(x + 0.4, y + 0.55, str(r["rank"]), ha="center", va="center", fontsize=10,
                weight="bold")
        ax.text(x + 0.4, y + 0.22, _label(r["coords"], s["cp"] > 1), ha="center",
                va="center", fontsize=7 if s["cp"] > 1 else 8)
    if "tp" in s["groups"]:
        for line in tp_lines:
            for node in sorted({r // g for r in line}):  # one outline per node it touches
                part = [r for r in line if r // g == node]
                x, y = _xy(part[0], s)
                ax.add_patch(Rectangle((x - 0.08, y - 0.08), len(part) - 0.04, 0.96,
                                       fill=False, ec="black", lw=1.6,
                                       ls="-" if len(part) == len(line) else "--"))
    for axis in ("pp", "cp", "dp"):
        for line in s["groups"].get(axis, []):
            for a, b in zip(line, line[1:], strict=False):
                _arc(ax, a, b, s, axis)
    handles = []
    for axis, (link, nodes) in s["links"].items():
        where = "inside a node" if nodes == 1 else f"spans {nodes} nodes"
        text = f"{axis.upper()} {s[axis]} · {link} ({where})"
        handles.append(Patch(fc=TP_FILLS[0], ec="black", label=text) if axis == "tp" else
                       Line2D([], [], color=AXIS_COLOURS[axis], ls="-" if nodes == 1 else "--",
                              label=text + (", arcs above" if axis != "dp" else ", arcs below")))
    if handles:
        ax.legend(handles=handles, loc="upper center", bbox_to_anchor=(0.5, 0.0), ncol=2,
                  fontsize=8, frameon=False)
    ax.set_xlim(-0.6, span + 0.3)
    ax.set_ylim(low - (rows - 1) * s["row_height"], high)
    ax.set_aspect("equal")
    ax.axis("off")
    names = "(dp,pp,cp,tp)" if s["cp"] > 1 else "(dp,pp,tp)"
    ax.set_title(f"DP {s['dp']} × PP {s['pp']} × TP {s['tp']}"
                 + (f" × CP {s['cp']}" if s["cp"] > 1 else "")
                 + f" on {s['world']} ranks, {g} per node; each square: rank and {names}",
                 fontsize=10)
    return fig


def grid_explorer(dp: int = 2, pp: int = 2, tp: int = 2, gpus_per_node: int = 4,
                  cp: int = 1) -> Explorer:
    """Sliders for the axis sizes and the GPUs per node; the grid redrawn on each change."""
    def slider(name: str, value: int, hi: int) -> widgets.IntSlider:
        return widgets.IntSlider(value=value, min=1, max=hi, description=name,
                                 continuous_update=False)

    controls = {"dp": slider("DP", dp, 4), "pp": slider("PP", pp, 4), "tp": slider("TP", tp, 8),
                "gpus_per_node": widgets.Dropdown(options=[2, 4, 8], value=gpus_per_node,
                                                  description="GPUs/node"),
                "cp": slider("CP", cp, 4)}

    def compute(**values: Any) -> Summary:
        try:
            return grid_summary(**values)
        except ValueError as error:
            return {"error": str(error)}

    def describe(s: Summary) -> str:
        return f"<b>cannot draw:</b> {s['error']}" if "error" in s else describe_grid(s)

    def plot(s: Summary) -> Figure:
        if "error" in s:
            fig, ax = plt.subplots(figsize=(6, 1), layout="constrained")
            ax.text(0.5, 0.5, s["error"], ha="center", va="center", wrap=True)
            ax.axis("off")
            return fig
        return plot_grid(s)

    return Explorer(controls, compute, describe, plot)


# --- memory per GPU, as recomputation and ZeRO change ---------------------------------------

STRATEGIES = ("ddp", "zero1", "zero3")
PART_COLOURS = {"weights": "tab:blue", "gradients": "tab:orange", "optimizer state": "tab:red",
                "gathered weights": "tab:pink", "activations": "tab:green"}


def memory_summary_3d(tp: int, pp: int, cp: int, micro_batch: int, strategy: str,
                      recompute: str, *, model: planner.Model, cluster: planner.Cluster,
                      global_batch: int) -> Summary:
    """Keys: the inputs; "dp", "m"; "bars" {(recompute, strategy): {part: bytes}}; "totals";
    "capacity" (90% of the GPU's memory); "chosen" (recompute, strategy); or "error"."""
    share = tp * pp * cp
    if cluster.gpus % share or global_batch % ((cluster.gpus // share) * micro_batch):
        return {"error": f"tp·pp·cp = {share} must divide {cluster.gpus} GPUs and the batch of "
                         f"{global_batch} must split into dp replicas × micro-batches of "
                         f"{micro_batch}"}
    dp = cluster.gpus // share
    shape = planner.Shape(dp=dp, pp=pp, ep=1, cp=cp, tp=tp)
    m = global_batch // (dp * micro_batch)
    bars = {}
    for rc in planner.RECOMPUTE:
        act = planner.activation_memory(model, shape, micro_batch=micro_batch, microbatches=m,
                                        recompute=rc)
        for st in STRATEGIES:
            bars[(rc, st)] = {**planner.state_memory(model, shape, st), "activations": act}
    return {"tp": tp, "pp": pp, "cp": cp, "dp": dp, "m": m, "micro_batch": micro_batch,
            "model": model, "cluster": cluster, "bars": bars,
            "totals": {k: sum(v.values()) for k, v in bars.items()},
            "capacity": 0.9 * cluster.memory, "chosen": (recompute, strategy)}


def describe_memory_3d(s: Summary) -> str:
    if "error" in s:
        return f"<b>cannot compute:</b> {s['error']}"
    parts = s["bars"][s["chosen"]]
    total = s["totals"][s["chosen"]]
    spread = ", ".join(f"{p} {v / 1e9:,.1f}" for p, v in parts.items())
    verdict = "fits" if total <= s["capacity"] else "does <b>not</b> fit"
    return (f"{s['model'].name}, TP {s['tp']} × PP {s['pp']} × CP {s['cp']} × DP {s['dp']}, "
            f"{s['m']} micro-batches of {s['micro_batch']}: {s['chosen'][1]} with "
            f"{s['chosen'][0]} recomputation, <b>{total / 1e9:,.1f} GB</b> per GPU of the first "
            f"stage ({spread} GB); {verdict} in {s['capacity'] / 1e9:.0f} GB (90% of "
            f"{s['cluster'].memory / 1e9:.0f} GB).")


def plot_memory_3d(s: Summary) -> Figure:
    fig, ax = plt.subplots(figsize=(9, 4.2), layout="constrained")
    if "error" in s:
        ax.text(0.5, 0.5, s["error"], ha="center", va="center", wrap=True)
        ax.axis("off")
        return fig
    labels, x = [], 0.0
    for rc in planner.RECOMPUTE:
        for st in STRATEGIES:
            bottom = 0.0
            for part, colour in PART_COLOURS.items():
                value = s["bars"][(rc, st)].get(part, 0.0) / 1e9
                ax.bar(x, value, bottom=bottom, color=colour, width=0.8,
                       label=part if (rc, st) == ("none", "zero3") else None,
                       edgecolor="black" if (rc, st) == s["chosen"] else "white",
                       linewidth=2 if (rc, st) == s["chosen"] else 0.5)
                bottom += value
            labels.append((x, f"{st}\n{rc}"))
            x += 1
        x += 0.6
    ax.axhline(s["capacity"] / 1e9, color="black", ls="--", lw=1,
               label=f"usable: 90% of {s['cluster'].memory / 1e9:.0f} GB")
    ax.set_xticks([p for p, _ in labels], [t for _, t in labels], fontsize=8)
    ax.set_ylabel("GB per GPU (first pipeline stage)")
    ax.set_xlabel("ZeRO strategy and activation recomputation")
    ax.set_title(f"{s['model'].name} on {s['cluster'].gpus} GPUs: TP {s['tp']} × PP {s['pp']} × "
                 f"CP {s['cp']} × DP {s['dp']}, micro-batch {s['micro_batch']}, m = {s['m']}",
                 fontsize=10)
    ax.legend(fontsize=8, loc="upper right")
    return fig


def memory_explorer_3d(*, model: planner.Model, cluster: planner.Cluster, global_batch: int,
                       tp: int = 8, pp: int = 4, cp: int = 1, micro_batch: int = 1,
                       strategy: str = "zero1", recompute: str = "selective") -> Explorer:
    """Dropdowns for the sizes, the ZeRO strategy and the recomputation policy."""
    def dropdown(name: str, options: list, value: Any) -> widgets.Dropdown:
        return widgets.Dropdown(options=options, value=value, description=name)

    divisors = [k for k in range(1, cluster.gpus + 1) if cluster.gpus % k == 0]
    controls = {"tp": dropdown("TP", [k for k in divisors if k <= 16], tp),
                "pp": dropdown("PP", [k for k in divisors if k <= model.layers], pp),
                "cp": dropdown("CP", [1, 2, 4, 8], cp),
                "micro_batch": dropdown("micro-batch", [1, 2, 4], micro_batch),
                "strategy": dropdown("ZeRO", list(STRATEGIES), strategy),
                "recompute": dropdown("recompute", list(planner.RECOMPUTE), recompute)}

    def compute(**values: Any) -> Summary:
        return memory_summary_3d(**values, model=model, cluster=cluster,
                                 global_batch=global_batch)

    return Explorer(controls, compute, describe_memory_3d, plot_memory_3d)


def h100_cluster(gpus: int) -> planner.Cluster:
    """H100 80 GB nodes of 8 on NVLink (450 GB/s a direction) and 400G InfiniBand (50 GB/s)."""
    return planner.Cluster(f"{gpus} × H100 80 GB ({gpus // 8} nodes)", gpus=gpus,
                           gpus_per_node=8, memory=costs.H100_MEMORY_BYTES,
                           intra_bw=costs.NVLINK_PER_DIRECTION_BYTES_PER_S,
                           inter_bw=costs.NIC_400G_BYTES_PER_S, flops=costs.H100_BF16_FLOPS)
