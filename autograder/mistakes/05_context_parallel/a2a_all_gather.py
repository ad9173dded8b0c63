"""Mistake: seq_to_heads all-gathers the whole tensor and keeps its own heads.

Replaces the exercise-5 answer's `seq_to_heads`. The values are right, but every rank
receives every head of every token: W - 1 times a rank's tensor instead of (W - 1)/W of it,
W times Ulysses' bytes. The check allows only all-to-alls and stops the all-gather before it
is made.
"""

import torch
import torch.distributed as dist

CAUGHT_BY = {
    "check_ulysses": "where an all-gather would send every rank the whole of it",
}


def seq_to_heads(x):
    W, r = dist.get_world_size(), dist.get_rank()
    parts = [torch.empty_like(x) for _ in range(W)]
    dist.all_gather(parts, x.contiguous())
    whole = torch.cat(parts, dim=2)  # (B, H, T, d)
    H = x.shape[1]
    return whole[:, r * H // W:(r + 1) * H // W].contiguous()
