"""Mistake: dropout multiplies its input in place.

`x.mul_(keep)` overwrites the tensor the caller passed in. The output is right, and inside the
layer the input is a temporary, so the layer check passes; but a caller that still needs x
(a residual, a second use) reads the dropped values. On a leaf tensor autograd refuses the
operation; the check passes a non-leaf and compares it with a copy afterwards.

Replaces sp_dropout (exercise 2).
"""

import torch
import torch.distributed as dist

CAUGHT_BY = {
    "check_sp_dropout": "modified its input x",
}


def sp_dropout(x, p_drop, generator):
    rank, t = dist.get_rank(), dist.get_world_size()
    B, n, C = x.shape
    keep = torch.rand((B, n * t, C), generator=generator) >= p_drop
    keep = keep[:, rank * n:(rank + 1) * n].clone()
    return x.mul_(keep.to(x.device)).div_(1 - p_drop)  # wrong: in place, into the caller's x
