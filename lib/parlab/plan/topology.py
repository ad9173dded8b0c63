"""A plan drawn on the cluster: nodes, GPUs with their coordinates, and what each link carries.

    from parlab import plan
    from parlab.plan import topology
    best = plan.best(plan.plan(plan.MODEL_512, plan.H100_512, global_batch=1920))
    fig = topology.draw_plan(best, plan.H100_512)     # "showing 4 of 64 nodes"

Each node is a box of small squares, one per GPU, labelled with its (dp, pp, tp) coordinates
(cp and ep too when they are used) and coloured by TP group; a black outline goes round each
TP group. An arrow runs from GPU 0 to its first neighbour along every other axis (PP, DP, CP,
EP); the legend says, for every axis, the link it rides, how many nodes a group spans and its
bytes per GPU per step, all taken from the plan. Big clusters show `max_nodes` nodes (4, or 2
when a node is an NVLink domain of more than 16 GPUs, drawn 8 to a row): node 0
and the nodes of GPU 0's neighbours first, so every axis that leaves the node has an arrow.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

from parlab.mesh import Mesh, make_mesh
from parlab.plan.types import Cluster, Plan

if TYPE_CHECKING:
    from matplotlib.artist import Artist
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure
# matplotlib is imported by the functions that draw: rank processes import parlab.plan (its
# costs) and never draw, and importing pyplot would cost each of them about a second of CPU.

AXIS_COLOURS = {"tp": "black", "cp": "tab:purple", "ep": "tab:orange", "pp": "tab:red",
                "dp": "tab:blue"}
_GAP = 1.2  # space between node boxes, in GPU squares


def _mesh(plan: Plan, cluster: Cluster) -> Mesh:
    return make_mesh(cluster.gpus, dp=plan.dp, tp=plan.tp, pp=plan.pp, cp=plan.cp, ep=plan.ep)


def _neighbour(mesh: Mesh, axis: str) -> int:
    return mesh.group_of(axis, 0)[1]


def shown_nodes(plan: Plan, cluster: Cluster, max_nodes: int = 4) -> list[int]:
    """Node 0, the nodes of GPU 0's neighbours along pp, dp, cp, ep, then the next nodes."""
    mesh, gpn = _mesh(plan, cluster), cluster.gpus_per_node
    wanted = [0] + [_neighbour(mesh, a) // gpn for a in ("pp", "dp", "cp", "ep")
                    if getattr(plan, a) > 1]
    wanted += range(cluster.nodes)
    shown: list[int] = []
    for node in wanted:
        if node not in shown and len(shown) < max_nodes:
            shown.append(node)
    return sorted(shown)


def _gb(nbytes: float) -> str:
    gb = nbytes / 1e9
    return f"{gb:,.0f} GB/step" if gb >= 100 else f"{gb:.3g} GB/step"


def _describe(plan: Plan, axis: str) -> str:
    """Legend text: size, link, how many nodes a group spans, bytes per GPU per step."""
    t = plan.axis(axis)
    if t is None:
        raise ValueError(f"the plan has no {axis} traffic to describe ({plan.label})")
    where = "inside a node" if t.intra_node else f"spans {t.nodes} nodes"
    size = f"{getattr(plan, axis)}" + (f" (dense grads over {t.size})"
                                       if t.size != getattr(plan, axis) else "")
    return f"{axis.upper()} {size} · {t.link} ({where}) · {_gb(t.nbytes)}"


class _Layout:
    """Where each shown GPU's square sits: nodes side by side, `cols` GPUs to a row."""

    def __init__(self, nodes: list[int], gpus_per_node: int):
        self.nodes, self.gpn = nodes, gpus_per_node
        self.cols = min(gpus_per_node, 4 if gpus_per_node <= 16 else 8)
        self.rows = math.ceil(gpus_per_node / self.cols)
        self.width = self.cols + _GAP

    def centre(self, rank: int) -> tuple[float, float]:
        slot, local = self.nodes.index(rank // self.gpn), rank % self.gpn
        return (slot * self.width + local % self.cols + 0.5, -(local // self.cols) - 0.5)

    def shown(self, rank: int) -> bool:
        return rank // self.gpn in self.nodes


def _label(coords: dict[str, int], plan: Plan) -> str:
    extra = " ".join(f"{a[0]}{coords[a]}" for a in ("cp", "ep") if getattr(plan, a) > 1)
    return f"d{coords['dp']} p{coords['pp']}\nt{coords['tp']}" + (f"\n{extra}" if extra else "")


def _draw_nodes(ax: Axes, mesh: Mesh, plan: Plan, lay: _Layout) -> None:
    import matplotlib.pyplot as plt
    from matplotlib.patches import FancyBboxPatch, Rectangle

    cmap = plt.get_cmap("tab20")
    for slot, node in enumerate(lay.nodes):
        x0 = slot * lay.width
        ax.add_patch(FancyBboxPatch((x0 - 0.1, -lay.rows - 0.1), lay.cols + 0.2, lay.rows + 0.2,
                                    boxstyle="round,pad=0.05", fc="whitesmoke", ec="grey"))
        ax.text(x0 + lay.cols / 2, 0.25, f"node {node}", ha="center", fontsize=8)
        for rank in range(node * lay.gpn, (node + 1) * lay.gpn):
            x, y = lay.centre(rank)
            colour = cmap((rank // plan.tp) % 20)
            ax.add_patch(Rectangle((x - 0.42, y - 0.42), 0.84, 0.84, fc=colour, ec="black",
                                   alpha=0.8))
            ax.text(x, y, _label(mesh.coords(rank), plan), ha="center", va="center",
                    fontsize=5.5)


def _draw_tp(ax: Axes, mesh: Mesh, lay: _Layout) -> None:
    """A black outline around each TP group's squares (its shown part)."""
    from matplotlib.patches import Rectangle

    for g in mesh.groups("tp"):
        centres = [lay.centre(r) for r in g if lay.shown(r)]
        if len(centres) > 1:
            xs, ys = zip(*centres, strict=True)
            ax.add_patch(Rectangle((min(xs) - 0.48, min(ys) - 0.48), max(xs) - min(xs) + 0.96,
                                   max(ys) - min(ys) + 0.96, fill=False,
                                   ec=AXIS_COLOURS["tp"], lw=1.8))


def _draw_axis(ax: Axes, mesh: Mesh, lay: _Layout, axis: str, level: int) -> None:
    """An arrow from GPU 0 to its next rank along `axis` (off the right edge if not shown)."""
    other, start = _neighbour(mesh, axis), lay.centre(0)
    style = {"arrowstyle": "->", "color": AXIS_COLOURS[axis], "lw": 1.6}
    if lay.shown(other):
        end = lay.centre(other)
        rad = -(1.6 + level) / max(1.0, abs(end[0] - start[0]))  # apex ~0.8 + level/2 above
        ax.annotate("", end, start, arrowprops={**style, "connectionstyle": f"arc3,rad={rad}"})
        return
    end = (len(lay.nodes) * lay.width - 0.2, 0.9 + 0.5 * level)
    ax.annotate("", end, start, arrowprops={**style, "linestyle": "--"})
    ax.text(end[0], end[1] + 0.05, f"{axis.upper()} → node {other // lay.gpn} (not shown)",
            color=AXIS_COLOURS[axis], fontsize=7, va="bottom", ha="right")


def draw_plan(plan: Plan, cluster: Cluster, ax: Axes | None = None, *,
              max_nodes: int | None = None) -> Figure:
    """The plan's rank grid on the cluster's nodes; see the module docstring."""
    import matplotlib.pyplot as plt
    from matplotlib.figure import Figure
    from matplotlib.lines import Line2D
    from matplotlib.patches import Patch

    if ax is None:
        _, ax = plt.subplots(figsize=(12, 4.2), layout="constrained")
    fig = ax.get_figure(root=True)
    assert isinstance(fig, Figure)  # an Axes always belongs to a root Figure
    mesh = _mesh(plan, cluster)
    if max_nodes is None:
        max_nodes = 4 if cluster.gpus_per_node <= 16 else 2
    lay = _Layout(shown_nodes(plan, cluster, max_nodes), cluster.gpus_per_node)
    _draw_nodes(ax, mesh, plan, lay)
    _draw_tp(ax, mesh, lay)
    axes = [a for a in ("pp", "dp", "cp", "ep") if getattr(plan, a) > 1]
    for level, axis in enumerate(axes):
        _draw_axis(ax, mesh, lay, axis, level)
    handles: list[Artist] = [Patch(fc=plt.get_cmap("tab20")(0), ec="black", label="GPU (d, p, "
                                   "t) = (dp, pp, tp) coordinates; colour: its TP group")]
    handles += [Line2D([], [], color=AXIS_COLOURS[a], lw=2, label=_describe(plan, a)
                       + (" (outlined groups)" if a == "tp" else ""))
                for a in (["tp"] if plan.tp > 1 else []) + axes]
    ax.legend(handles=handles, loc="upper left", fontsize=7, ncol=2, bbox_to_anchor=(0, 0),
              title="links carry, per GPU per step", title_fontsize=7)
    title = f"{plan.label} on {cluster.name}"
    if len(lay.nodes) < cluster.nodes:
        title += f": showing {len(lay.nodes)} of {cluster.nodes} nodes"
    ax.set_title(title, fontsize=10)
    ax.set_xlim(-0.5, len(lay.nodes) * lay.width + 0.5)
    ax.set_ylim(-lay.rows - 0.3, 1.1 + 0.5 * len(axes))
    ax.set_aspect("equal")
    ax.axis("off")
    return fig
