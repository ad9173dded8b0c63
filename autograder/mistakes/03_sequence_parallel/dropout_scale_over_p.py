"""Mistake: dropout scales the kept values by 1/p_drop instead of 1/(1 - p_drop).

The mask is the single device's. At p_drop = 0.5 the two scales are the same number, so a
check at 0.5 passes it; at any other probability the expected value of the output is wrong.
The check uses p_drop = 0.25, where 1/p_drop = 4 and 1/(1 - p_drop) = 4/3.

Replaces sp_dropout (exercise 2).
"""

import torch
import torch.distributed as dist

CAUGHT_BY = {
    "check_sp_dropout": "the kept values are scaled by 1/p_drop",
    "check_sp_block": "your dropout differs from the single device's",
}


def sp_dropout(x, p_drop, generator):
    rank, t = dist.get_rank(), dist.get_world_size()
    B, n, C = x.shape
    keep = torch.rand((B, n * t, C), generator=generator) >= p_drop
    keep = keep[:, rank * n:(rank + 1) * n].clone()
    return x * keep.to(x.device) / p_drop  # wrong: 1 / p_drop, not 1 / (1 - p_drop)
