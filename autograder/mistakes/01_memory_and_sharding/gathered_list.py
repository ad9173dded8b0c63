"""Mistake: all_gather_flat returns the list of gathered shards, not their concatenation.

Replaces all_gather_flat (exercise 2).
"""

import torch
import torch.distributed as dist

CAUGHT_BY = {"check_flat_shards": "returned a list, not the flat vector"}


def all_gather_flat(shard):
    parts = [torch.empty_like(shard) for _ in range(dist.get_world_size())]
    dist.all_gather(parts, shard.contiguous())
    return parts  # wrong: a list of t shards, not the (P,) vector
