r"""After backward, before the optimizer: make every gradient the single-device one.

    ddps = data_parallel(model, grid)   # BucketedDDP over grid.dp (and grid.expert_dp)
    # run_schedule(...) runs the backwards; the last one of each chunk starts the buckets
    finalize_grads(model, grid)         # Megatron's finalize_model_grads, in three sums

Each rank's backward leaves gradients that are partial in three ways; each is fixed by one
reduction (all linear, over the lines of one grid, so their order does not matter):

1. Sequence parallelism: the RMSNorm weights (and, under SP, the MoE router and experts)
   saw only this TP rank's tokens: sum over `grid.tp`
   (`parlab.tp.allreduce_sequence_parallel_grads`). Forgetting it is silent in the first
   forward: the losses only drift once the TP ranks' copies have taken different steps.
2. A tied embedding split over the pipeline: stage 0's table and the last stage's head copy
   each hold one use's gradient: sum over `grid.embedding`.
3. Data parallelism: each of the dp × ep × cp ranks computed the gradient of its own mean
   loss; the mean of equal-sized means is the global mean, so average over `grid.dp`.
   Experts live on the dp × cp ranks of one ep coordinate and every one of the dp·ep·cp
   losses reached them through the all-to-all: average over `grid.expert_dp`, then scale by
   |expert_dp| / |dp| = 1/ep (Megatron's expert gradient scaling).

The data-parallel sync is `parlab.dp.ddp.BucketedDDP`, the one mechanism: `data_parallel`
gives the model's two (dense, experts), made once and kept with the parameters (`bucketed`);
`run_schedule` runs every backward but the last of each chunk inside their `no_sync()`, so
the buckets leave while the last micro-batch's backward is still running, and
`sync_data_parallel(params, group=...)` (the seam `Parts` can replace) calls their
`finish()`: it waits for the buckets and writes the means back. An expert that got no rows
on this rank has no gradient: its bucket leaves in `finish`, its gradient as zeros, so every
rank of a group reduces tensors of the same sizes in the same order.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable, Iterable

import torch
import torch.distributed as dist
from torch import nn

from parlab.compose.grid import Grid, group_size
from parlab.compose.stage import ParallelLlama
from parlab.dp.ddp import BucketedDDP
from parlab.tp.sequence import allreduce_sequence_parallel_grads

__all__ = ["BUCKET_BYTES", "bucketed", "data_parallel", "sync_data_parallel", "sum_grads",
           "finalize_grads"]

Sync = Callable[..., None]
BUCKET_BYTES = 2**14
"""Bucket size of the composed runs: 16 KiB, so the tiny Llama's stages (~100 KiB of float32
gradients each) leave in several buckets, as a real model's do at 25 MiB."""

# (group id, parameter ids) -> its BucketedDDP. Weak: the hooks on the parameters keep a
# BucketedDDP alive exactly as long as its parameters live.
_DDPS: weakref.WeakValueDictionary[tuple[int, ...], BucketedDDP] = weakref.WeakValueDictionary()


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


def bucketed(params: Iterable[nn.Parameter], *, group: dist.ProcessGroup | None = None,
             bucket_bytes: int = BUCKET_BYTES) -> BucketedDDP:
    """The BucketedDDP of exactly these parameters over `group`, made on first use."""
    params = list(params)
    key = (id(group), *map(id, params))
    ddp = _DDPS.get(key)
    if ddp is None:
        ddp = _DDPS[key] = BucketedDDP(params, group=group, bucket_bytes=bucket_bytes)
    return ddp


def data_parallel(model: ParallelLlama, grid: Grid) -> list[BucketedDDP]:
    """The model's data-parallel syncs: dense parameters over grid.dp, experts (if any) over
    grid.expert_dp."""
    out = [bucketed(model.dense_params(), group=grid.dp)]
    experts = model.expert_params()
    if experts:
        out.append(bucketed(experts, group=grid.expert_dp))
    return out


def sync_data_parallel(params: Iterable[nn.Parameter], *,
                       group: dist.ProcessGroup | None = None) -> None:
    """The DP gradient sync: every gradient averaged over `group` by the parameters'
    BucketedDDP (`finish()`: the buckets that backward started, then the rest)."""
    bucketed(params, group=group).finish()


def finalize_grads(model: ParallelLlama, grid: Grid, *,
                   sync_sequence_parallel: Sync = allreduce_sequence_parallel_grads,
                   sync_dp: Sync = sync_data_parallel) -> None:
    """The three reductions above, on this rank's gradients."""
    sync_dp(model.dense_params(), group=grid.dp)
    experts = model.expert_params()
    if experts:
        sync_dp(experts, group=grid.expert_dp)  # the mean over the expert's copies ...
        share = group_size(grid.expert_dp) / group_size(grid.dp)  # ... is ep times the
        for p in experts:  # global mean: scale by 1/ep
            if p.grad is not None:
                p.grad.mul_(share)
    _flat_grads(model.unique_parameters())  # None -> zeros, the same sizes on every rank
    sync_sequence_parallel(model.sequence_parallel_params(), group=grid.tp)
    copies = model.embedding_copies()
    if copies:
        sum_grads(copies, group=grid.embedding)
