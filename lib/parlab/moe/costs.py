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
"""

from __future__ import annotations

import math

from parlab import costs
from parlab.moe.layer import expert_capacity

__all__ = ["ep_a2a_bytes", "a2a_cost", "uniform_remote_nodes"]


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
    """{"flat": {...}, "hierarchical": {...}}: inter/intra bytes per rank, messages, seconds."""
    g, ep = gpus_per_node, nodes * gpus_per_node
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
