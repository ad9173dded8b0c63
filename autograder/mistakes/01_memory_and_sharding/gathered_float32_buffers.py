"""Mistake: all_gather_flat gathers into buffers made with torch.empty(n): float32 whatever the
shard is.

Right for float32 parameters, which were all the checks used; a bf16 or float64 shard meets
float32 buffers, which gloo refuses ("Invalid usage of tensors with different dtypes") and
NCCL need not. The visible test now runs a float64 shard on 3 ranks.

Replaces all_gather_flat (exercise 2).
"""

import torch
import torch.distributed as dist

CAUGHT_BY = {"check_flat_shards_float64": "torch.empty(n) and torch.zeros(n) are float32"}


def all_gather_flat(shard):
    parts = [torch.empty(shard.numel()) for _ in range(dist.get_world_size())]  # wrong dtype
    dist.all_gather(parts, shard.contiguous())
    return torch.cat(parts)
