"""Mistake: the reduce-scattered gradient is not divided by the number of ranks.

The reduce-scatter sums the ranks' gradients; DDP's step uses their mean, so every shard's
gradient is t times too large and the SGD step t times too long.

Replaces reduce_scatter_flat (exercise 2).
"""

import torch
import torch.distributed as dist

CAUGHT_BY = {"check_flat_shards": "the reduce-scatter sums",
             "check_fsdp_layer": "the reduce-scatter sums"}


def reduce_scatter_flat(grad):
    t = dist.get_world_size()
    parts = [part.contiguous() for part in grad.chunk(t)]
    out = torch.empty_like(parts[0])
    dist.reduce_scatter(out, parts)
    return out  # wrong: the sum, not the mean
