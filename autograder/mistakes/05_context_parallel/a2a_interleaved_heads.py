"""Mistake: seq_to_heads sends heads r, r + W, r + 2W, ... to rank r (a strided split).

Replaces the exercise-5 answer's `seq_to_heads`: the heads are reshaped as (H/W, W) instead
of (W, H/W), so rank j receives every W-th head. The attention per head would still be right
if heads_to_seq undid it the same way; against the head blocks Ulysses (and TP, which owns
contiguous blocks of heads) uses, it is wrong. The check recognises the strided heads.
"""

import torch
import torch.distributed as dist

CAUGHT_BY = {
    "check_ulysses": "your rank r got heads r, r + W, r + 2W",
}


def seq_to_heads(x):
    W = dist.get_world_size()
    B, H, n, d = x.shape
    send = x.reshape(B, H // W, W, n, d).permute(2, 0, 1, 3, 4).contiguous()  # wrong: strided
    recv = torch.empty_like(send)
    dist.all_to_all_single(recv, send)
    return recv.permute(1, 2, 0, 3, 4).reshape(B, H // W, W * n, d)
