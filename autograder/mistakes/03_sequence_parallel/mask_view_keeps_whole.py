"""Mistake: dropout keeps a slice of the whole mask, a view that keeps all of it alive.

keep[:, rows] is a view of the (B, T, C) mask. Multiplying by it saves the view for backward,
and the view holds the storage of the whole mask: the shard saves t times the bytes it needs,
and the memory sequence parallelism was meant to save on dropout is not saved.

Replaces sp_dropout (exercise 2).
"""

import torch
import torch.distributed as dist

CAUGHT_BY = {
    "check_sp_dropout": "it keeps the whole (B, T, C) mask alive",
}


def sp_dropout(x, p_drop, generator):
    rank, t = dist.get_rank(), dist.get_world_size()
    B, n, C = x.shape
    keep = torch.rand((B, n * t, C), generator=generator) >= p_drop
    return x * keep[:, rank * n:(rank + 1) * n] / (1 - p_drop)  # wrong: a view of it all
