"""Mistake: the gradient all-reduced instead of reduce-scattered, then this rank's slice kept.

The values are right, but an all-reduce sends 2(t-1)/t of the gradient per rank against the
reduce-scatter's (t-1)/t, and leaves a full-size gradient on every rank.

Replaces reduce_scatter_flat (exercise 2).
"""

import torch.distributed as dist

CAUGHT_BY = {"check_flat_shards": "the gradients were all-reduced instead of reduce-scattered",
             "check_fsdp_layer": "the gradients were all-reduced instead of reduce-scattered"}


def reduce_scatter_flat(grad):
    rank, t = dist.get_rank(), dist.get_world_size()
    total = grad.clone()
    dist.all_reduce(total)  # wrong: every rank gets the whole sum
    n = grad.numel() // t
    return total[rank * n:(rank + 1) * n] / t
