r"""Module 07's tables, as Markdown: what each axis sends, where it lands, how plans compare.

    from parlab.plan import tables
    display(Markdown(tables.axis_table(8192, 4096, heads=64)))      # section 1
    display(Markdown(tables.placement_table(sizes, ["tp", "pp", "dp"], traffic, cluster,
                                            nodes_spanned)))     # section 3, your functions
    display(Markdown(tables.plans_table(plans)))                    # section 5
    display(Markdown(tables.published_table()))                     # section 5, published runs
    display(Markdown(tables.variants_table()))                      # DualPipe-V and Ulysses

`axis_table` prices one transformer layer on each axis alone with the planner's own cost
function (`parlab.plan.costs.axis_bytes`), so it matches the planner by construction, and
every row has one scope: bytes one GPU sends for one micro-batch through one layer, forward
and backward (DP: the layer's gradients, once a step). EP's layer is an MoE with top-k routing
at capacity factor 1.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch

from parlab.plan.costs import axis_bytes
from parlab.plan.planner import best, evaluate, plan
from parlab.plan.presets import PRESETS, PUBLISHED, PUBLISHED_VARIANTS
from parlab.plan.types import Cluster, Model, Plan, Shape

__all__ = ["markdown", "AxisRow", "axis_rows", "axis_table", "placement_table", "plans_table",
           "published_table", "variant_plans", "variants_table"]


def markdown(header: Sequence[str], rows: Sequence[Sequence[object]]) -> str:
    """A Markdown table: a header row, the separator, one line per row."""
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]
    return "\n".join(lines)


@dataclass(frozen=True)
class AxisRow:
    """One axis of section 1's table."""

    axis: str
    splits: str
    sends: str
    nbytes: float
    """Bytes one GPU sends for one micro-batch through one layer, forward and backward."""
    when: str


def axis_rows(hidden: int, seq: int, *, heads: int, ranks: int = 8, micro_batch: int = 1,
              experts: int = 64, top_k: int = 2) -> list[AxisRow]:
    """Each axis alone with `ranks` ranks on one layer of width `hidden`, sequence `seq`."""
    h = hidden
    dense = Model("one layer", 12 * h * h, layers=1, hidden=h, heads=heads, seq=seq)
    expert_params = experts * 8 * h * h  # E MLPs of 8h^2
    moe = Model("one MoE layer", 4 * h * h + expert_params, layers=1, hidden=h, heads=heads,
                seq=seq, experts=experts, top_k=top_k, expert_params=expert_params)

    def sent(model: Model, axis: str) -> float:
        shape = Shape(**{a: ranks if a == axis else 1 for a in Shape._fields})
        return axis_bytes(model, shape, strategy="ddp", micro_batch=micro_batch,
                          microbatches=1)[axis]

    return [
        AxisRow("TP", "each layer's weights", "with SP, 6 all-gathers and 4 reduce-scatters of "
                "(b, s, h): 2 + 2 forward, 4 + 2 backward", sent(dense, "tp"),
                "every layer, on the critical path"),
        AxisRow("PP", "the layers, into stages", "an activation forward, its gradient backward",
                sent(dense, "pp"), "once per stage boundary"),
        AxisRow("DP", "the batch", "one all-reduce of the layer's gradients", sent(dense, "dp"),
                "once per step, overlapped with backward"),
        AxisRow("CP", "the sequence", "K and V around a ring forward; K, V, dK, dV backward",
                sent(dense, "cp"), "every layer"),
        AxisRow("EP", "the experts", f"dispatch and combine all-to-alls of the top-{top_k} "
                "copies, forward and backward", sent(moe, "ep"),
                "every MoE layer, on the critical path"),
    ]


def axis_table(hidden: int, seq: int, *, heads: int, ranks: int = 8, micro_batch: int = 1,
               experts: int = 64, top_k: int = 2) -> str:
    """`axis_rows` as Markdown, bytes in MiB."""
    rows = axis_rows(hidden, seq, heads=heads, ranks=ranks, micro_batch=micro_batch,
                     experts=experts, top_k=top_k)
    return markdown(["axis", "splits", "sends", f"MiB per GPU ({ranks} ranks)", "how often"],
                    [(r.axis, r.splits, r.sends, f"{r.nbytes / 2**20:,.0f}", r.when)
                     for r in rows])


def placement_table(sizes: dict[str, int], order: Sequence[str], traffic: dict[str, float],
                    cluster: Cluster, nodes_spanned: Callable[[list, int], int]) -> str:
    """Each axis of a grid laid out `order` (innermost first), its groups put on `cluster`'s
    nodes by `nodes_spanned(groups, gpus_per_node)`, its `traffic` (bytes per GPU per step)
    priced on the link it lands on."""
    outer_first = list(reversed(order))
    world = math.prod(sizes[a] for a in order)
    grid = torch.arange(world).view(*[sizes[a] for a in outer_first])
    rows = []
    for axis in order:
        dim = outer_first.index(axis)
        groups = grid.movedim(dim, -1).reshape(-1, sizes[axis]).tolist()
        span = nodes_spanned(groups, cluster.gpus_per_node)
        link, bw = ((cluster.intra_name, cluster.intra_bw) if span == 1 else
                    (cluster.inter_name, cluster.inter_bw))
        rows.append((f"{axis.upper()} {sizes[axis]}", span, link,
                     f"{traffic[axis] / 1e9:,.1f} GB", f"{traffic[axis] / bw:,.2f} s"))
    return markdown(["axis", "nodes one group spans", "link", "bytes per GPU per step",
                     "time on that link"], rows)


def plans_table(plans: Sequence[Plan]) -> str:
    """Plans side by side: kept?, memory, DP bytes, step time, MFU."""
    rows = []
    for p in plans:
        dp = p.axis("dp")
        rows.append((p.label, p.micro_batch, "yes" if p.kept else "no",
                     f"{p.memory_total / 1e9:.1f}", f"{dp.nbytes / 1e9:,.0f} GB" if dp else "0",
                     f"{p.step_s:.1f}", f"{p.mfu:.0%}"))
    return markdown(["plan", "micro-batch", "kept?", "GB per GPU", "DP bytes per GPU per step",
                     "step s", "MFU"], rows)


def published_table(names: Sequence[str] = tuple(PUBLISHED)) -> str:
    """Each published run (`presets.PUBLISHED`): its plan judged by the planner, the planner's
    own top plan, and the MFU of each, the run's published one beside them."""
    rows = []
    for name in names:
        model, cluster, batch = PRESETS[name]
        sizes, published_mfu = PUBLISHED[name]
        theirs = evaluate(model, cluster, global_batch=batch, recompute="full", dp=sizes["dp"],
                          tp=sizes.get("tp", 1), pp=sizes.get("pp", 1), cp=sizes.get("cp", 1),
                          ep=sizes.get("ep", 1))
        top = best(plan(model, cluster, global_batch=batch))
        tp = top.axis("tp") if top else None
        rows.append((model.name, theirs.label, "yes" if theirs.kept else "no",
                     f"{theirs.mfu:.0%}", top.label if top else "none fits",
                     "yes" if top and (tp is None or tp.intra_node) else "no",
                     f"{top.mfu:.0%}" if top else "", published_mfu))
    return markdown(["run", "published plan", "kept?", "its MFU (planner)", "planner's top plan",
                     "TP inside a node?", "top's MFU", "published MFU"], rows)


_ALTERNATIVE = {"schedule": {"dualpipe_v": "1f1b", "1f1b": "dualpipe_v"},
                "cp_kind": {"ring": "ulysses", "ulysses": "ring"}}


def variant_plans(name: str) -> tuple[Plan, Plan]:
    """A run of `PUBLISHED_VARIANTS` judged as published (its schedule or CP variant) and with
    the other choice in its place (1F1B for DualPipe-V, Ulysses for ring, ...); full
    recomputation, as `published_table`."""
    model, cluster, batch, sizes, _ = PUBLISHED_VARIANTS[name]
    dp, tp, pp, cp, ep = (int(sizes.get(a, 1)) for a in ("dp", "tp", "pp", "cp", "ep"))
    schedule, cp_kind = str(sizes.get("schedule", "1f1b")), str(sizes.get("cp_kind", "ring"))

    def judged(schedule: str, cp_kind: str) -> Plan:
        return evaluate(model, cluster, global_batch=batch, recompute="full", dp=dp, tp=tp,
                        pp=pp, cp=cp, ep=ep, schedule=schedule, cp_kind=cp_kind)

    if "schedule" in sizes:
        return judged(schedule, cp_kind), judged(_ALTERNATIVE["schedule"][schedule], cp_kind)
    return judged(schedule, cp_kind), judged(schedule, _ALTERNATIVE["cp_kind"][cp_kind])


def variants_table(names: Sequence[str] = tuple(PUBLISHED_VARIANTS)) -> str:
    """Each run of `PUBLISHED_VARIANTS`, as published and with the other choice: kept?,
    bubble, exposed CP seconds, step time, MFU, and the first reason when rejected."""
    rows = []
    for name in names:
        for p in variant_plans(name):
            why = "" if p.kept else p.reasons[0]
            rows.append((name, p.label, "yes" if p.kept else "no", f"{p.bubble:.1%}",
                         f"{p.times.get('EP comms', 0.0):.2f}",
                         f"{p.times.get('CP comms', 0.0):.2f}", f"{p.step_s:.1f}",
                         f"{p.mfu:.0%}", why))
    return markdown(["run", "plan", "kept?", "bubble", "EP s exposed", "CP s exposed",
                     "step s", "MFU", "rejected because"], rows)
