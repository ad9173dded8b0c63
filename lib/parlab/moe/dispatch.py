r"""Expert parallelism: dispatch tokens to their experts' ranks and combine them back.

$E$ experts over the $\mathrm{ep}$ ranks of the expert-parallel group (its degree, `ep` in
code), $E_l = E/\mathrm{ep}$ each, placed in blocks: rank $r$ holds global experts
$rE_l, \dots, (r+1)E_l - 1$, so expert $e$ lives on rank $\lfloor e / E_l \rfloor$ as local
expert $e \bmod E_l$. Every rank holds the router whole and its own $N$ tokens $(N, C)$.

One layer, forward (`ep_moe`):
1. route locally: experts (N, k), gates (N, k);
2. sort the $Nk$ assignments by global expert (hence by destination rank): send buffer
   $(Nk, C)$ and per-expert counts $(E,)$;
3. exchange the counts (an all-to-all of $E_l$ integers per rank pair): each rank learns how
   many rows it will receive from whom, for which local expert — the split sizes of step 4;
4. dispatch: `all_to_all_single` with uneven splits;
5. run each local expert on its rows;
6. combine: the reverse `all_to_all_single` (splits swapped);
7. unsort, weight by gates, sum over the $k$ choices, add the residual.
Backward mirrors it: the gradient of an all-to-all is the all-to-all with splits swapped
(`AllToAll`). Steps 3, 4 and 6 are on the critical path and cannot start before routing.

With a capacity $c$ (`ep_moe_capacity`) every rank sends exactly $c$ slots per expert, padded
with zeros, dropping assignments past $c$ (`parlab.moe.keep_mask`): the buffers are
$(E c, C)$ on every rank, the splits equal and known in advance, so no counts are exchanged.

Collectives are called as `dist.all_to_all_single(...)`, so `parlab.comm` sees them.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist
from torch import Tensor, nn

from parlab.moe.layer import MoE, ffn, keep_mask, queue_position

__all__ = ["ExpertShard", "AllToAll", "all_to_all", "ep_moe", "ep_moe_capacity", "owner"]


def owner(expert: Tensor | int, *, num_experts: int, ep: int) -> Any:
    """Rank holding global expert e under block placement: e // (E / ep)."""
    return expert // (num_experts // ep)


class ExpertShard(nn.Module):
    """This rank's experts of a MoE: w1 (E_l, C, F), w2 (E_l, F, C), E_l = E / ep."""

    def __init__(self, layer: MoE, rank: int, ep: int) -> None:
        super().__init__()
        if layer.num_experts % ep:
            raise ValueError(f"{layer.num_experts} experts do not split over {ep} ranks")
        self.num_experts, self.k = layer.num_experts, layer.k
        self.local = layer.num_experts // ep
        self.first = rank * self.local  # global id of local expert 0
        rows = slice(self.first, self.first + self.local)
        self.w1 = nn.Parameter(layer.w1.detach()[rows].clone())
        self.w2 = nn.Parameter(layer.w2.detach()[rows].clone())

    def expert(self, j: int, h: Tensor) -> Tensor:
        """Local expert j (global id first + j) on rows h: (n, C) -> (n, C)."""
        return ffn(h, self.w1[j], self.w2[j])


class AllToAll(torch.autograd.Function):
    """forward: all_to_all_single with (out_splits, in_splits); backward: splits swapped."""

    @staticmethod
    def forward(ctx: Any, x: Tensor, out_splits: list[int], in_splits: list[int],
                group: dist.ProcessGroup | None = None) -> Tensor:
        ctx.splits, ctx.group = (out_splits, in_splits), group
        out = x.new_empty((sum(out_splits), *x.shape[1:]))
        dist.all_to_all_single(out, x.contiguous(), out_splits, in_splits, group=group)
        return out

    @staticmethod
    def backward(ctx: Any, grad: Tensor) -> tuple[Tensor, None, None, None]:
        out_splits, in_splits = ctx.splits
        back = grad.new_empty((sum(in_splits), *grad.shape[1:]))
        dist.all_to_all_single(back, grad.contiguous(), in_splits, out_splits, group=ctx.group)
        return back, None, None, None


def all_to_all(x: Tensor, out_splits: list[int], in_splits: list[int], *,
               group: dist.ProcessGroup | None = None) -> Tensor:
    """Differentiable all_to_all_single: rows of x go out in blocks of in_splits."""
    return AllToAll.apply(x, out_splits, in_splits, group)


def _exchange_counts(per_expert: Tensor, ep: int, group: dist.ProcessGroup | None) -> Tensor:
    """(E,) rows this rank sends to each global expert -> (ep, E_l): rows it receives from
    each source rank for each local expert."""
    recv = torch.empty_like(per_expert)
    dist.all_to_all_single(recv, per_expert, group=group)  # equal splits of E_l counts
    return recv.view(ep, -1)


def _run_local(shard: ExpertShard, rows: Tensor, local_ids: Tensor) -> Tensor:
    """Each local expert on the rows that carry its id; same order out as in.

    Starts from rows * 0, not zeros_like(rows): the result stays in the autograd graph when
    this rank got no rows at all, so its backward still runs the two all-to-alls its ep
    peers run (and its experts' .grad stays None: they computed nothing)."""
    out = rows * 0
    for j in range(shard.local):
        sel = (local_ids == j).nonzero().flatten()
        if sel.numel():
            out = out.index_add(0, sel, shard.expert(j, rows[sel]))
    return out


def ep_moe(x: Tensor, gates: Tensor, experts: Tensor, shard: ExpertShard, *,
           group: dist.ProcessGroup | None = None) -> Tensor:
    """y = x + sum_j g_ij FFN_{e_ij}(x_i) with experts on their ranks (no capacity).

    x (N, C) this rank's tokens; gates (N, k); experts (N, k) global ids."""
    ep = dist.get_world_size(group)
    n, k = experts.shape
    flat = experts.flatten()  # (Nk,): token i choice j at i*k + j
    order = torch.argsort(flat, stable=True)  # by expert, hence by destination rank
    send = x[order // k]  # (Nk, C)
    per_expert = torch.bincount(flat, minlength=shard.num_experts)  # (E,)
    recv_counts = _exchange_counts(per_expert, ep, group)  # (ep, E_l)
    in_splits = per_expert.view(ep, -1).sum(dim=1).tolist()
    out_splits = recv_counts.sum(dim=1).tolist()
    rows = all_to_all(send, out_splits, in_splits, group=group)  # (sum out, C)
    local_ids = torch.repeat_interleave(torch.arange(shard.local, device=x.device).repeat(ep),
                                        recv_counts.flatten())
    done = _run_local(shard, rows, local_ids)
    back = all_to_all(done, in_splits, out_splits, group=group)  # (Nk, C), sorted order
    contrib = torch.zeros_like(back).index_copy(0, order, back)  # (Nk, C), token order
    return x + (gates.reshape(-1, 1) * contrib).view(n, k, -1).sum(dim=1)


def ep_moe_capacity(x: Tensor, gates: Tensor, experts: Tensor, shard: ExpertShard, *,
                    capacity: int, group: dist.ProcessGroup | None = None) -> Tensor:
    """ep_moe with at most `capacity` slots per expert from this rank: static (E c, C) buffers.

    Dropped assignments (keep_mask) add nothing; a token with none kept returns x_i."""
    ep = dist.get_world_size(group)
    n, k = experts.shape
    e_count, c = shard.num_experts, capacity
    keep = keep_mask(experts, num_experts=e_count, capacity=c)  # (N, k)
    slot = experts * c + queue_position(experts, num_experts=e_count)  # (N, k) in (E c)
    token = torch.arange(n, device=x.device).unsqueeze(1).expand(n, k)
    send = x.new_zeros(e_count * c, x.shape[1]).index_copy(0, slot[keep], x[token[keep]])
    splits = [shard.local * c] * ep  # equal, known before the router runs
    rows = all_to_all(send, splits, splits, group=group)
    local_ids = torch.arange(shard.local, device=x.device).repeat_interleave(c).repeat(ep)
    done = _run_local(shard, rows, local_ids)
    back = all_to_all(done, splits, splits, group=group)
    picked = back[slot.clamp(max=e_count * c - 1).flatten()].view(n, k, -1)  # (N, k, C)
    weight = (gates * keep).unsqueeze(-1)  # dropped: 0
    return x + (weight * picked).sum(dim=1)
