"""Mistake: sp_dropout draws the whole mask for two ranks, as in the notebook's runs.

The whole (B, T, C) mask has T = t * T/t rows; written as n * 2 it is right on 2 ranks only.
On 3 ranks (the visible test's second call) rank 2's rows of a (B, 2n, C) mask do not exist
and ranks 0 and 1 get rows of a mask drawn with another shape: the numbers differ from the
single device's.

Replaces sp_dropout (exercise 2).
"""

import torch
import torch.distributed as dist

CAUGHT_BY = {"check_sp_dropout_p": "take t from dist.get_world_size()"}


def sp_dropout(x, p_drop, generator):
    rank = dist.get_rank()
    B, n, C = x.shape
    keep = torch.rand((B, n * 2, C), generator=generator) >= p_drop  # wrong: t written as 2
    keep = keep[:, rank * n:(rank + 1) * n].clone()
    return x * keep.to(x.device) / (1 - p_drop)
