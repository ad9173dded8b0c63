r"""One gradient norm for the whole grid: `torch.nn.utils.clip_grad_norm_` of the single device.

    specs = shard_specs(rep)                       # this rank's pieces, after finalize_grads
    total = clip_grad_norm_(specs, 1.0, rep.grid)  # the single device's norm, on every rank

The single device clips with $\|g\|_2 = \sqrt{\sum_i g_i^2}$ over every entry of every
parameter and multiplies every gradient by $\min(1, \mathrm{max\_norm}/(\|g\|_2 + 10^{-6}))$.
On a grid no rank holds all of $g$, and some hold the same entries:

- a piece split over TP (`tp_dim`), EP (`ep_dim`) or the pipeline (each stage its own layers)
  is a different part of $g$ on each rank: every piece counts;
- a tensor whole on every TP rank (`tp_dim` None: the RMSNorms, and whatever else TP does not
  split), a dense tensor on the ep ranks (`ep_dim` None), the tied embedding's copy on the
  last stage (`tied_copy`), and every piece on its dp·cp ranks are copies: one counts.

So each rank sums the squares of the pieces it *owns*, those with coordinate 0 along every axis
the piece is copied over (tp if `tp_dim` is None, ep if `ep_dim` is None, dp and cp always;
the tied copy never: stage 0 holds it), and one all-reduce of that scalar over the world gives
every rank $\|g\|_2^2$. Why the world: every rank must scale its gradients by the same
coefficient, so every rank needs the same total.

Megatron-LM (`get_grad_norm_fp32`, megatron/core/optimizer/clip_grads.py) drops the TP
duplicates and the shared embedding's second copy, then all-reduces the squares over its
optimizer's `get_grad_stats_parallel_group()`: without the distributed optimizer, the
model-parallel group (the replicas hold equal gradients after the DP all-reduce, so each
computes the same total by itself); with it, the world (every rank of the distributed-optimizer
instance, `DistributedOptimizer.get_grad_stats_parallel_group` in distrib_optimizer.py), since
after the reduce-scatter each DP rank holds a slice of its own and every rank's squares count.
Here the dp·cp replicas hold copies, so the world with them masked out gives the same number,
and a scalar all-reduce costs its latency, not its bytes. torchtitan (`clip_grad_norm_`,
torchtitan/distributed/utils.py) calls `torch.nn.utils.get_total_norm` once on all the
gradients, which returns a DTensor still to be reduced; one `full_tensor()` reduces it over the
mesh dimensions the gradients are split on; with pipeline parallelism it then all-reduces
$\|g\|^p$ over the pipeline's group (`pp_mesh`) and takes the root: a sum over the stages.

The ∞-norm, $\max_i |g_i|$, needs no owner: a maximum counts copies harmlessly, so it is an
all-reduce with MAX over the world. Other p: $(\sum_i |g_i|^p)^{1/p}$, owners as for p = 2.

Gradients must be final (`finalize_grads`: SP sums, the tied embedding's sum, the DP mean)
before the norm is taken; with ZeRO-1 they are not (it reduce-scatters inside its step), which
this function does not handle.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch
import torch.distributed as dist
from torch import Tensor

from parlab.compose.grid import Grid
from parlab.compose.shards import ShardSpec

__all__ = ["EPS", "owns", "clip_grad_norm_"]

EPS = 1e-6
"""Added to the norm before dividing, as `torch.nn.utils.clip_grad_norm_` does."""


def owns(spec: ShardSpec, grid: Grid) -> bool:
    """Whether this rank counts `spec`'s piece in a global norm: exactly one rank of the world
    owns each piece of each single-device tensor."""
    c = grid.coords
    first = c["dp"] == 0 and c["cp"] == 0  # every piece is repeated over the dp·cp ranks
    whole_on_tp = spec.tp_dim is None and c["tp"] != 0
    dense_on_ep = spec.ep_dim is None and c["ep"] != 0
    return first and not whole_on_tp and not dense_on_ep and not spec.tied_copy


def clip_grad_norm_(specs: Sequence[ShardSpec], max_norm: float, grid: Grid, *,
                    norm_type: float = 2.0, eps: float = EPS) -> Tensor:
    """Scale every gradient of this rank's pieces in place by min(1, max_norm / (norm + eps)),
    norm being the single-device model's total gradient norm; returns the norm (a 0-d float32
    tensor on this rank's device, the same on every rank). Call on every rank of the grid.

    forward: the owned pieces' local sum of |g|^p (max |g| for p = inf), one all-reduce over
    the world; backward: none (gradients are data here, not part of a graph)."""
    grads = [s.param.grad for s in specs if s.param.grad is not None]
    mine = [s.param.grad for s in specs if s.param.grad is not None and owns(s, grid)]
    device = grads[0].device if grads else torch.device("cpu")
    p = float(norm_type)
    if math.isinf(p):  # copies do not change a maximum: every piece may vote
        local = torch.stack([g.detach().abs().max() for g in grads if g.numel()]).max() \
            if grads else torch.zeros((), device=device)
        total = local.float().clone()
        dist.all_reduce(total, op=dist.ReduceOp.MAX)
    else:
        total = torch.zeros((), dtype=torch.float32, device=device)
        for g in mine:
            total += g.detach().float().abs().pow(p).sum()  # () sum of |g|^p
        dist.all_reduce(total)  # world: every rank the same sum, each piece once
        total = total.pow(1.0 / p)
    coef = torch.clamp(max_norm / (total + eps), max=1.0)  # () as torch's clip_grad_norm_
    for g in grads:
        g.detach().mul_(coef.to(g.dtype))
    return total
