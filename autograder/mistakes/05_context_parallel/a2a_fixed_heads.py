"""Mistake: seq_to_heads assumes the 12 query heads of the check for every tensor.

Replaces the exercise-5 answer's `seq_to_heads`: H = 12 is written in instead of read from
x.shape[1]. The reshuffle check passes (it sends 12 heads), but under grouped-query attention
k and v have fewer heads (W, one per rank), and the reshape fails. The check says which
tensor it was and that H must come from the input.
"""

import torch
import torch.distributed as dist

CAUGHT_BY = {
    "check_ulysses": "read H from x.shape[1]",
}


def seq_to_heads(x):
    W = dist.get_world_size()
    B, _, n, d = x.shape
    H = 12  # wrong: x.shape[1]
    send = x.reshape(B, W, H // W, n, d).transpose(0, 1).contiguous()
    recv = torch.empty_like(send)
    dist.all_to_all_single(recv, send)
    return recv.permute(1, 2, 0, 3, 4).reshape(B, H // W, W * n, d)
