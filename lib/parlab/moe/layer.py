r"""Mixture of experts on one device: router, capacity, drops, and the layer as a token loop.

A MoE layer replaces the MLP by $E$ expert MLPs and a router $W_r \in \mathbb{R}^{E \times C}$.
For token $x_i$ (a row of the $(N, C)$ input):

- probabilities $p_i = \mathrm{softmax}(W_r x_i)$ over all $E$ experts;
- its $k$ experts $e_{i1}, \dots, e_{ik}$ are the top-$k$ of $p_i$ (largest first), its gates
  $g_{ij} = p_{i e_{ij}}$, not renormalised over the chosen $k$ (Switch's top-1 gate, taken to
  $k$ choices; GShard's top-2 gating and DeepSeek-V3 divide by the chosen ones' sum instead);
- output $y_i = x_i + \sum_j m_{ij}\, g_{ij}\, \mathrm{FFN}_{e_{ij}}(x_i)$ with
  $\mathrm{FFN}_e(h) = \mathrm{GeLU}(h W_1^{(e)}) W_2^{(e)}$ and $m_{ij} \in \{0, 1\}$ the keep
  mask (all ones without a capacity). A dropped assignment skips its expert; a token dropped
  by all its experts leaves the layer unchanged, through the residual.

Auxiliary balance loss (Switch Transformer, with $k$ choices per token):
$L_\text{aux} = E \sum_e f_e P_e$, $f_e$ = share of the $Nk$ assignments that chose $e$,
$P_e$ = mean over tokens of $p_{ie}$. It is 1 for a perfectly even router and at most $E/k$:
when every token picks the same $k$ experts, each has $f_e = 1/k$ and their $P_e$ sum to at
most 1 (for top-1, $E$).

Capacity: each expert takes at most $c = \lceil \phi\, N k / E \rceil$ assignments from a group
of $N$ tokens ($\phi$ = capacity factor). Rule (`keep_mask`): assignments are served in order
of choice first (every token's first choice before any second choice), then token index; an
expert keeps the first $c$ it is offered. Under expert parallelism the group is one rank's
tokens, so every rank sends every expert exactly $c$ slots: static sizes.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn

__all__ = ["MoE", "route", "balance_loss", "expert_capacity", "keep_mask", "queue_position",
           "moe_reference", "ffn", "load_stats", "bias_update"]


class MoE(nn.Module):
    """Router (E, C) and E expert MLPs: w1 (E, C, F), w2 (E, F, C); seeded, small values."""

    def __init__(self, hidden: int, ffn: int, num_experts: int, *, k: int = 2) -> None:
        super().__init__()
        self.num_experts, self.k = num_experts, k
        self.router = nn.Parameter(torch.randn(num_experts, hidden) / hidden**0.5)  # (E, C)
        self.w1 = nn.Parameter(torch.randn(num_experts, hidden, ffn) / hidden**0.5)  # (E, C, F)
        self.w2 = nn.Parameter(torch.randn(num_experts, ffn, hidden) / ffn**0.5)  # (E, F, C)

    def expert(self, e: int, h: Tensor) -> Tensor:
        """FFN_e(h): (n, C) -> (n, C)."""
        return ffn(h, self.w1[e], self.w2[e])

    def forward(self, x: Tensor, *, capacity_factor: float | None = None,
                groups: int = 1) -> Tensor:
        gates, experts, _ = route(x, self.router, k=self.k)
        return moe_reference(x, gates, experts, self.expert, num_experts=self.num_experts,
                             capacity_factor=capacity_factor, groups=groups)


def ffn(h: Tensor, w1: Tensor, w2: Tensor) -> Tensor:
    """GeLU(h w1) w2: (n, C) @ (C, F) -> (n, F) -> (n, C)."""
    return F.gelu(h @ w1) @ w2


def route(x: Tensor, weight: Tensor, *, k: int) -> tuple[Tensor, Tensor, Tensor]:
    """(gates (N, k), experts (N, k) int64, probs (N, E)) of the top-k softmax router."""
    probs = torch.softmax(x @ weight.t(), dim=-1)  # (N, E)
    gates, experts = probs.topk(k, dim=-1)  # largest first
    return gates, experts, probs


def balance_loss(probs: Tensor, experts: Tensor, *, num_experts: int) -> Tensor:
    """E * sum_e f_e P_e; f_e = share of the N k assignments to e, P_e = mean prob of e."""
    counts = torch.bincount(experts.flatten(), minlength=num_experts).to(probs.dtype)  # (E,)
    f = counts / experts.numel()
    return num_experts * (f * probs.mean(dim=0)).sum()


def expert_capacity(n_tokens: int, *, num_experts: int, k: int, capacity_factor: float) -> int:
    """c = ceil(capacity_factor * n_tokens * k / num_experts): slots per expert and group."""
    return math.ceil(capacity_factor * n_tokens * k / num_experts - 1e-9)


def keep_mask(experts: Tensor, *, num_experts: int, capacity: int) -> Tensor:
    """(N, k) bool: choice j of token i is kept when fewer than `capacity` assignments to its
    expert come before it in the order (choice, token)."""
    return queue_position(experts, num_experts=num_experts) < capacity


def queue_position(experts: Tensor, *, num_experts: int) -> Tensor:
    """(N, k) int64: how many assignments to the same expert come before choice j of token i
    in the order (choice, token): its slot in the expert's buffer when kept."""
    order = experts.t().flatten()  # choice-major: all first choices, then all second ...
    onehot = F.one_hot(order, num_experts)  # (kN, E)
    position = (onehot.cumsum(dim=0) * onehot).sum(dim=1) - 1  # place in its expert's queue
    return position.view(experts.shape[1], -1).t().contiguous()


def moe_reference(x: Tensor, gates: Tensor, experts: Tensor, expert_fn, *, num_experts: int,
                  capacity_factor: float | None = None, groups: int = 1) -> Tensor:
    """y_i = x_i + sum_j m_ij g_ij FFN_{e_ij}(x_i), one token at a time (the slow, plain way).

    With a capacity factor the N tokens form `groups` equal groups (a rank's tokens each) and
    `keep_mask` applies in each with c = expert_capacity(N / groups, ...)."""
    n, k = experts.shape
    keep = torch.ones_like(experts, dtype=torch.bool)
    if capacity_factor is not None:
        size = n // groups
        cap = expert_capacity(size, num_experts=num_experts, k=k, capacity_factor=capacity_factor)
        keep = torch.cat([keep_mask(experts[g * size:(g + 1) * size], num_experts=num_experts,
                                    capacity=cap) for g in range(groups)])
    rows = []
    for i in range(n):
        out = x[i]
        for j in range(k):
            if keep[i, j]:
                out = out + gates[i, j] * expert_fn(int(experts[i, j]), x[i:i + 1])[0]
        rows.append(out)
    return torch.stack(rows)


@dataclass(frozen=True)
class LoadStats:
    """Assignments offered to and kept by each expert, for one capacity factor."""

    capacity: int
    offered: list[int]
    kept: list[int]
    dropped_tokens: int  # tokens that lost every one of their k experts
    dropped_assignments: int


def load_stats(experts: Tensor, *, num_experts: int, capacity_factor: float) -> LoadStats:
    """Per-expert load and drops of one group of tokens routed to `experts` (N, k)."""
    n, k = experts.shape
    cap = expert_capacity(n, num_experts=num_experts, k=k, capacity_factor=capacity_factor)
    keep = keep_mask(experts, num_experts=num_experts, capacity=cap)
    offered = torch.bincount(experts.flatten(), minlength=num_experts)
    kept = torch.bincount(experts[keep], minlength=num_experts)
    return LoadStats(cap, offered.tolist(), kept.tolist(), int((~keep.any(dim=1)).sum()),
                     int((~keep).sum()))


def bias_update(bias: Tensor, experts: Tensor, *, num_experts: int, rate: float) -> Tensor:
    r"""Auxiliary-loss-free balancing (DeepSeek-V3): b_e <- b_e + rate * sign(mean load - load_e).

    The bias is added to the router scores for choosing the top-k only (not to the gates):
    an overloaded expert is chosen less next step, an idle one more."""
    load = torch.bincount(experts.flatten(), minlength=num_experts).to(bias.dtype)
    return bias + rate * torch.sign(load.mean() - load)
