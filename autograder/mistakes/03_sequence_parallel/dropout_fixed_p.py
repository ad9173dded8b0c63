"""Mistake: sp_dropout writes in the notebook's p_drop = 0.25 instead of reading its argument.

Replaces sp_dropout (exercise 2). Every visible run uses p_drop = 0.25, so the answer passes
them; the hidden test also drops with p_drop = 0.1, where this mask keeps too few values and
scales them by 1/0.75.
"""

import torch
import torch.distributed as dist

CAUGHT_BY = {"check_sp_dropout_p": "it dropped with p_drop = 0.25, the notebook's example"}


def sp_dropout(x, p_drop, generator):
    rank, t = dist.get_rank(), dist.get_world_size()
    B, n, C = x.shape
    keep = torch.rand((B, n * t, C), generator=generator) >= 0.25  # wrong: p_drop
    keep = keep[:, rank * n:(rank + 1) * n].clone()
    return x * keep.to(x.device) / 0.75  # wrong: 1 - p_drop
