r"""Cost models of the expert-parallel all-to-all: bytes per layer, flat against hierarchical.

$\mathrm{ep}$ (`ep` in code) is the expert-parallel degree: the ranks the experts are spread
over. $d$ is the bytes per element (2 for bf16).

Bytes (`ep_a2a_bytes`). With a capacity $c = \lceil \phi N k / E \rceil$ a rank's dispatch
buffer is $E c$ rows of $h$ elements, $n = E c\,h\,d$ bytes, of which
$\frac{\mathrm{ep}-1}{\mathrm{ep}}$ leave the rank; the combine sends as much back. Forward:
$2\frac{\mathrm{ep}-1}{\mathrm{ep}}E c\,h\,d \approx
2\frac{\mathrm{ep}-1}{\mathrm{ep}}\phi N k\,h\,d$, and the backward pass repeats both. The
volume grows with the tokens $N$, the hidden size $h$, $k$ and $\phi$. A data-parallel
all-reduce moves gradients, a size set by the parameters $P$: its per-rank bytes
$2\frac{r-1}{r}P d$ over $r$ ranks hardly move with $r$.

Flat against hierarchical (`a2a_cost`). $\mathrm{ep} = G g$ ranks on $G$ nodes of $g$. A rank
sends $N$ tokens to $k$ experts each, chosen uniformly among $E$ experts spread evenly:
- flat: every (token, expert) copy travels on its own: $Nk\frac{\mathrm{ep}-g}{\mathrm{ep}}$ rows
  cross nodes and $Nk\frac{g-1}{\mathrm{ep}}$ stay on NVLink; $\mathrm{ep} - 1$ messages;
- hierarchical (intra-node first, as DeepEP/HybridEP do): a token crosses to each remote node
  that holds one of its experts ONCE, then fans out inside that node: on average
  $N (G-1)(1 - q)$ rows cross nodes with $q = \binom{E - E/G}{k} / \binom{E}{k}$ the chance
  that a given node holds none of the token's experts; the fan-out adds the remote copies
  to the NVLink bytes; $(G - 1) + 2(g - 1)$ messages.
Time $= \alpha\,\text{messages} + \text{inter bytes}/B_\text{inter} + \text{intra
bytes}/B_\text{intra}$ (links used one after the other: a bound, not a simulation).

Rows an expert layer computes (`expert_rows`). With a capacity $c$ every expert runs $c$
rows, padding included, and an expert offered $n_e > c$ assignments drops $n_e - c$: $Ec$ rows
in all. Dropless (MegaBlocks, Gale et al. 2022) runs exactly $\sum_e n_e = Nk$ rows as one
grouped GEMM over groups of $n_e$ rows: no padding, no drop, a largest group of $\max_e n_e$.

Data-parallel sizes under EP (`data_parallel_sizes`). Megatron-Core lays the same ranks out
twice (MoE parallel folding): dense layers as TP × CP × DP × PP, expert layers as ETP × EP ×
EDP × PP (ETP, the expert tensor-parallel size, splits each expert's matrices inside an EP
rank). The two layouts only share PP: EP × ETP must divide world/PP, and EP may fold over the
dense layers' CP and TP ranks as well as their DP ranks (16 GPUs as TP 4 × DP 4 for attention
can run EP 8 × ETP 1 × EDP 2 for the experts). A dense weight is copied on the DP·CP ranks of
its (pp, tp) place, $\text{world}/(p\,t)$ of them; an expert's on the EDP $= \text{world}/(p
\cdot \mathrm{ep} \cdot \mathrm{etp})$ ranks. In this course's grid (`parlab.compose.grid`,
EP inside DP and etp = t) the dense DP is $d e$, the dense replicas $d e c$ and EDP $d c$.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from parlab import costs
from parlab.moe.layer import expert_capacity

__all__ = ["ep_a2a_bytes", "a2a_cost", "uniform_remote_nodes", "expert_rows",
           "data_parallel_sizes"]


def ep_a2a_bytes(n_tokens: int, hidden: int, ep: int, *, num_experts: int, k: int,
                 capacity_factor: float, dtype_bytes: int = 2) -> float:
    """Bytes one rank sends in one layer's forward (dispatch + combine) under a capacity, with
    the experts over `ep` ranks."""
    c = expert_capacity(n_tokens, num_experts=num_experts, k=k, capacity_factor=capacity_factor)
    return 2 * costs.all_to_all_bytes(num_experts * c * hidden * dtype_bytes, ep)


def uniform_remote_nodes(num_experts: int, k: int, nodes: int) -> float:
    """Expected number of other nodes holding at least one of a token's k distinct experts."""
    per_node = num_experts // nodes
    q = math.comb(num_experts - per_node, k) / math.comb(num_experts, k)
    return (nodes - 1) * (1 - q)


def a2a_cost(n_tokens: int, hidden: int, *, k: int, num_experts: int, nodes: int,
             gpus_per_node: int, dtype_bytes: int = 2, intra_bw: float = 450e9,
             inter_bw: float = 50e9, alpha: float = 5e-6) -> dict[str, dict[str, float]]:
    """{"flat": {...}, "hierarchical": {...}}: inter/intra bytes per rank, messages, seconds.
    The EP degree ep = nodes · gpus_per_node must divide num_experts: each rank holds E/ep
    whole experts (an expert is not split over ranks here)."""
    g, ep = gpus_per_node, nodes * gpus_per_node
    if num_experts % ep:
        raise ValueError(f"{nodes} nodes of {gpus_per_node} GPUs make an EP degree of {ep}, "
                         f"which does not divide the {num_experts} experts: every rank must "
                         f"hold a whole number of experts (ep <= E and ep | E)")
    row = hidden * dtype_bytes
    flat_inter = n_tokens * k * (ep - g) / ep * row
    flat_intra = n_tokens * k * (g - 1) / ep * row
    hier_inter = n_tokens * uniform_remote_nodes(num_experts, k, nodes) * row
    hier_intra = flat_intra + flat_inter  # every remote copy fans out once inside its node
    out = {}
    for name, inter, intra, msgs in (("flat", flat_inter, flat_intra, ep - 1),
                                     ("hierarchical", hier_inter, hier_intra,
                                      (nodes - 1) + 2 * (g - 1))):
        out[name] = {"inter_bytes": inter, "intra_bytes": intra, "messages": float(msgs),
                     "seconds": alpha * msgs + inter / inter_bw + intra / intra_bw}
    return out


def expert_rows(loads: Sequence[int], *, capacity: int | None) -> dict[str, int]:
    """Rows the experts compute for assignment counts `loads` (E,): with `capacity` slots each
    (padded and dropping), or dropless (`capacity=None`: one grouped GEMM of the exact loads).

    {"computed": rows run, "padding": empty slots run, "dropped": assignments not served,
    "largest": the largest group (the slowest expert's rows)}."""
    loads = [int(n) for n in loads]
    if any(n < 0 for n in loads):
        raise ValueError(f"loads {loads} must be counts of assignments (>= 0)")
    if capacity is None:
        return {"computed": sum(loads), "padding": 0, "dropped": 0, "largest": max(loads)}
    if capacity < 0:
        raise ValueError(f"capacity={capacity} must be >= 0 slots per expert")
    kept = [min(n, capacity) for n in loads]
    return {"computed": capacity * len(loads), "padding": capacity * len(loads) - sum(kept),
            "dropped": sum(loads) - sum(kept), "largest": capacity}


def data_parallel_sizes(world: int, *, pp: int = 1, tp: int = 1, cp: int = 1, ep: int = 1,
                        expert_tp: int | None = None) -> dict[str, int | None]:
    """How many ranks hold a copy of each weight, Megatron-Core's way (module docstring).

    {"dp": Megatron's data-parallel size world/(pp·tp·cp) (this course's d·e),
    "dense_replicas": ranks a dense weight's gradient is averaged over, world/(pp·tp) = DP·CP,
    "expert_dp": EDP = world/(pp·ep·etp), the copies of one expert (this course's d·c when
    etp = tp, the default), "course_dp": d = DP/ep, the dp coordinate of `parlab.mesh`, or None
    when the experts fold over more than DP (ep not dividing DP, or etp != tp): that layout is
    not this course's grid}."""
    etp = tp if expert_tp is None else expert_tp
    for name, n in (("world", world), ("pp", pp), ("tp", tp), ("cp", cp), ("ep", ep),
                    ("expert_tp", etp)):
        if n < 1:
            raise ValueError(f"{name}={n} must be a positive integer")
    if world % (pp * tp * cp):
        raise ValueError(f"pp·tp·cp = {pp * tp * cp} does not divide world={world}")
    if world % (pp * ep * etp):
        raise ValueError(f"pp·ep·expert_tp = {pp * ep * etp} does not divide world={world}: the "
                         "expert layers lay the world/pp ranks of a stage out as EP × ETP × EDP, "
                         f"so EP × ETP = {ep * etp} must divide world/pp (it may fold over the "
                         "dense layers' DP, CP and TP ranks)")
    dp = world // (pp * tp * cp)
    in_grid = dp % ep == 0 and etp == tp
    return {"dp": dp, "dense_replicas": dp * cp, "expert_dp": world // (pp * ep * etp),
            "course_dp": dp // ep if in_grid else None}
