r"""After backward, before the optimizer: make every gradient the single-device one.

    finalize_grads(model, grid)      # Megatron's finalize_model_grads, in three sums

Each rank's backward leaves gradients that are partial in three ways; each is fixed by one
reduction (all linear, so their order does not matter):

1. Sequence parallelism: the RMSNorm weights (and, under SP, the MoE router and experts)
   saw only this TP rank's tokens: sum over `grid.tp`
   (`parlab.tp.allreduce_sequence_parallel_grads`). Forgetting it is silent in the first
   forward: the losses only drift once the TP ranks' copies have taken different steps.
2. A tied embedding split over the pipeline: stage 0's table and the last stage's head copy
   each hold one use's gradient: sum over `grid.embedding`.
3. Data parallelism: each of the dp × ep × cp ranks computed the gradient of its own mean
   loss; the mean of equal-sized means is the global mean, so average over `grid.dp`
   (`sync_data_parallel`). Experts live on the dp × cp ranks of one ep coordinate and every
   one of the dp·ep·cp losses reached them through the all-to-all: sum over
   `grid.expert_dp`, divide by dp·ep·cp (Megatron's expert gradient scaling).

`sync_data_parallel(params, group=...)` is the seam where `parlab.dp.ddp.BucketedDDP` goes:
flatten, all-reduce, divide, here after the whole backward; BucketedDDP reduces the buckets
as backward fills them and its `finish()` leaves the same mean.

A gradient that is None (an expert that got no rows on this rank) is made zeros first, so
every rank of a group reduces tensors of the same sizes.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

import torch
import torch.distributed as dist
from torch import nn

from parlab.compose.grid import Grid, group_size
from parlab.compose.stage import ParallelLlama
from parlab.tp.sequence import allreduce_sequence_parallel_grads

__all__ = ["sync_data_parallel", "sum_grads", "finalize_grads"]

Sync = Callable[..., None]


def _flat_grads(params: Iterable[nn.Parameter]) -> list[torch.Tensor]:
    grads = []
    for p in params:
        if p.grad is None:
            p.grad = torch.zeros_like(p)
        grads.append(p.grad)
    return grads


def sum_grads(params: Iterable[nn.Parameter], *, group: dist.ProcessGroup | None = None,
              scale: float = 1.0) -> None:
    """grad <- scale * (sum of grad over `group`), one all-reduce of the flattened grads."""
    grads = _flat_grads(params)
    if not grads or (group_size(group) == 1 and scale == 1.0):
        return
    flat = torch.cat([g.reshape(-1) for g in grads])  # (n,)
    if group_size(group) > 1:
        dist.all_reduce(flat, group=group)
    flat *= scale
    for g, part in zip(grads, flat.split([g.numel() for g in grads]), strict=True):
        g.copy_(part.view_as(g))


def sync_data_parallel(params: Iterable[nn.Parameter], *,
                       group: dist.ProcessGroup | None = None) -> None:
    """The DP gradient sync: every gradient averaged over `group` (flatten, all_reduce,
    divide). The one place BucketedDDP replaces."""
    sum_grads(params, group=group, scale=1.0 / group_size(group))


def finalize_grads(model: ParallelLlama, grid: Grid, *,
                   sync_sequence_parallel: Sync = allreduce_sequence_parallel_grads,
                   sync_dp: Sync = sync_data_parallel) -> None:
    """The three reductions above, on this rank's gradients."""
    _flat_grads(model.unique_parameters())  # None -> zeros, the same sizes on every rank
    sync_sequence_parallel(model.sequence_parallel_params(), group=grid.tp)
    copies = model.embedding_copies()
    if copies:
        sum_grads(copies, group=grid.embedding)
    sync_dp(model.dense_params(), group=grid.dp)
    experts = model.expert_params()
    if experts:
        sync_dp(experts, group=grid.expert_dp)  # the mean over the expert's copies ...
        share = group_size(grid.expert_dp) / group_size(grid.dp)  # ... is ep times the
        for p in experts:  # global mean: scale by 1/ep
            assert p.grad is not None
            p.grad.mul_(share)
