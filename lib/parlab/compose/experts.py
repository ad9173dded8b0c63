r"""Expert parallelism for the Llama's MoE layers: SwiGLU experts over the ep ranks.

    moe = ExpertParallelMoE(block.mlp, grid)      # this rank's E/ep experts, the whole router
    y = moe(h, pos)                                # h (B, n, C) this rank's tokens -> (B, n, C)

E experts over ep ranks in blocks (module 06's placement, `parlab.moe.owner`): ep rank j holds
experts $jE_l .. (j+1)E_l - 1$, $E_l = E/ep$. Every rank routes its own tokens and trades them
with the other ep ranks of its group, which hold other rows of the batch (EP is folded into
data parallelism, `parlab.compose.grid`). One layer, forward:

1. route: module 06's top-k softmax (`parlab.moe.route`), gates (N, k), experts (N, k);
2. keep: module 06's capacity rule per sequence (`parlab.model.sequence_keep_mask`). Under CP
   or SP a rank holds part of each sequence, so the expert ids of the whole sequence are
   gathered first (all-gathers of N·k integers over tp, then cp) and every rank applies the
   one-device rule to the whole sequence and keeps its own positions' rows;
3. sort the kept assignments by expert (hence by ep rank) and exchange the counts (an
   all-to-all of E integers): the split sizes of step 4;
4. dispatch: `parlab.moe.all_to_all` (all_to_all_single with uneven splits, differentiable);
5. each local expert on its rows; 6. combine: the reverse all-to-all;
7. weight each row by its gate and add it to its token: $y_i = \sum_j m_{ij} g_{ij}
   \mathrm{FFN}_{e_{ij}}(x_i)$ (the block adds the residual).

With TP the experts are not split (Megatron's expert-tensor-parallel size 1) and the layer
needs SP, as Megatron requires for MoE with TP: each TP rank then routes only its own 1/t of
the tokens, and its router and expert gradients are partial sums over TP, reduced with the
LayerNorms' (`sequence_parallel_params`). Expert gradients are then averaged over the expert's
copies, `grid.expert_dp` (dp × cp ranks), and scaled by 1/ep: every one of the dp·ep·cp
data-parallel losses reached this expert through the all-to-all, so the mean over all of them
is the sum over the copies divided by dp·ep·cp (`parlab.compose.grads`).
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch import Tensor, nn

from parlab.compose.grid import Grid, Positions, group_size
from parlab.model.llama import MoESwiGLU, sequence_keep_mask, swiglu
from parlab.moe.dispatch import all_to_all
from parlab.moe.layer import route

__all__ = ["ExpertParallelMoE", "gather_sequence", "exchange_counts"]


def gather_sequence(part: Tensor, pos: Positions, *, tp_group: dist.ProcessGroup | None = None,
                    cp_group: dist.ProcessGroup | None = None,
                    sequence_parallel: bool = True) -> Tensor:
    """(B, n_sp, k) per rank -> (B, T, k) on every rank, in global position order (no grad)."""
    if sequence_parallel and group_size(tp_group) > 1:
        parts = [torch.empty_like(part) for _ in range(group_size(tp_group))]
        dist.all_gather(parts, part.contiguous(), group=tp_group)
        part = torch.cat(parts, dim=1)  # (B, n, k): this CP rank's positions, in order
    cp = group_size(cp_group)
    if cp == 1:
        return part
    parts = [torch.empty_like(part) for _ in range(cp)]
    dist.all_gather(parts, part.contiguous(), group=cp_group)
    full = part.new_empty(part.shape[0], pos.table.numel(), part.shape[2])  # (B, T, k)
    for r in range(cp):
        full[:, pos.table[r]] = parts[r]
    return full


def exchange_counts(per_expert: Tensor, *, group: dist.ProcessGroup | None = None) -> Tensor:
    """(E,) rows this rank sends to each global expert -> (ep, E_l): the rows it will receive
    from each ep rank for each of its local experts (an all-to-all of E_l integers a pair)."""
    recv = torch.empty_like(per_expert)
    dist.all_to_all_single(recv, per_expert.contiguous(), group=group)
    return recv.view(group_size(group), -1)


class ExpertParallelMoE(nn.Module):
    """This rank's share of a `MoESwiGLU`: the router (E, C) whole, experts first..first+E_l."""

    def __init__(self, moe: MoESwiGLU, grid: Grid, *, sequence_parallel: bool) -> None:
        super().__init__()
        ep = grid.size("ep")
        if moe.num_experts % ep:
            raise ValueError(f"{moe.num_experts} experts do not split over ep={ep} ranks: "
                             "use an expert-parallel size that divides the number of experts")
        self.grid, self.sequence_parallel = grid, sequence_parallel
        self.num_experts, self.k = moe.num_experts, moe.k
        self.capacity_factor = moe.capacity_factor
        self.local = moe.num_experts // ep
        self.first = grid.coords["ep"] * self.local  # global id of local expert 0
        rows = slice(self.first, self.first + self.local)
        self.router = nn.Parameter(moe.router.detach().clone())  # (E, C)
        self.gate = nn.Parameter(moe.gate.detach()[rows].clone())  # (E_l, F, C)
        self.up = nn.Parameter(moe.up.detach()[rows].clone())  # (E_l, F, C)
        self.down = nn.Parameter(moe.down.detach()[rows].clone())  # (E_l, C, F)

    def _keep(self, experts: Tensor, pos: Positions) -> Tensor:
        """(B, n, k) keep mask of this rank's tokens under the per-sequence capacity."""
        if self.capacity_factor is None:
            return torch.ones_like(experts, dtype=torch.bool)
        full = gather_sequence(experts, pos, tp_group=self.grid.tp, cp_group=self.grid.cp,
                               sequence_parallel=self.sequence_parallel)  # (B, T, k)
        keep = sequence_keep_mask(full, num_experts=self.num_experts,
                                  capacity_factor=self.capacity_factor)  # (B, T, k)
        return keep[:, pos.sp]  # (B, n, k): this rank's positions

    def _run_local(self, rows: Tensor, local_ids: Tensor) -> Tensor:
        """Each local expert on the rows that carry its id: (R, C) -> (R, C).

        Starts from rows * 0, not zeros_like(rows): the result must stay in the autograd
        graph even when this rank got no rows at all, or its backward would skip the two
        all-to-alls its ep peers run, and they would wait for it (or read wrong sizes)."""
        out = rows * 0
        for j in range(self.local):
            sel = (local_ids == j).nonzero().flatten()
            if sel.numel():
                out = out.index_add(0, sel, swiglu(rows[sel], self.gate[j], self.up[j],
                                                   self.down[j]))
        return out

    def forward(self, h: Tensor, pos: Positions) -> Tensor:  # (B, n, C) -> (B, n, C)
        B, n, C = h.shape
        flat = h.reshape(-1, C)  # (N, C)
        gates, experts, _ = route(flat, self.router, k=self.k)  # (N, k), (N, k)
        keep = self._keep(experts.view(B, n, self.k), pos).reshape(-1)  # (N k,)
        kept = keep.nonzero().flatten()  # assignment ids i*k + j that are served
        assign = kept[torch.argsort(experts.reshape(-1)[kept], stable=True)]  # by expert
        send = flat[assign // self.k]  # (A, C), sorted by expert, hence by ep rank
        per_expert = torch.bincount(experts.reshape(-1)[assign], minlength=self.num_experts)
        group, ep = self.grid.ep, self.grid.size("ep")
        counts = exchange_counts(per_expert, group=group)  # (ep, E_l)
        in_splits = per_expert.view(ep, -1).sum(dim=1).tolist()
        out_splits = counts.sum(dim=1).tolist()
        rows = all_to_all(send, out_splits, in_splits, group=group)  # (R, C) for my experts
        local_ids = torch.repeat_interleave(
            torch.arange(self.local, device=h.device).repeat(ep), counts.flatten())  # (R,)
        back = all_to_all(self._run_local(rows, local_ids), in_splits, out_splits,
                          group=group)  # (A, C), in `assign` order
        weighted = gates.reshape(-1)[assign, None] * back  # (A, C)
        return torch.zeros_like(flat).index_add(0, assign // self.k, weighted).view(B, n, C)

    def expert_params(self) -> list[nn.Parameter]:
        """The parameters held by this ep rank only (averaged over grid.expert_dp)."""
        return [self.gate, self.up, self.down]
