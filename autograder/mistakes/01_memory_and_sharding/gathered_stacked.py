"""Mistake: all_gather_flat stacks the gathered shards instead of concatenating them.

torch.stack gives a (t, n) matrix; the flat parameter is the (P,) vector torch.cat gives.

Replaces all_gather_flat (exercise 2).
"""

import torch
import torch.distributed as dist

CAUGHT_BY = {"check_flat_shards": "torch.cat(parts), not torch.stack(parts)"}


def all_gather_flat(shard):
    parts = [torch.empty_like(shard) for _ in range(dist.get_world_size())]
    dist.all_gather(parts, shard.contiguous())
    return torch.stack(parts)  # wrong: (t, n), not (P,)
