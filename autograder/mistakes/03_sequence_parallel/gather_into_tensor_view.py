"""Mistake: all_gather_into_tensor, then a reshape to (B, T, C).

all_gather_into_tensor stacks the ranks' (B, T/t, C) shards along dim 0 into (t*B, T/t, C).
Reshaping that to (B, T, C) does not move rank r's rows next to each other along the
sequence: it re-reads the memory in another order, so tokens of different sequences end up
side by side. The shape is right and the values are wrong.

Replaces all_gather_sequence (exercise 1).
"""

import torch
import torch.distributed as dist

CAUGHT_BY = {
    "check_sp_pair": "stacks the shards along dim 0",
    "check_sp_block": "check_sp_pair",
}


def all_gather_sequence(x):
    t = dist.get_world_size()
    B, n, C = x.shape
    out = torch.empty(t * B, n, C, dtype=x.dtype, device=x.device)
    dist.all_gather_into_tensor(out, x.contiguous())
    return out.reshape(B, t * n, C)  # wrong: mixes batch and sequence
