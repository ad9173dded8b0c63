"""Mistake: heads_to_seq puts the received head blocks back interleaved.

Replaces the exercise-5 answer's `heads_to_seq`: block i received from rank i holds heads
i H/W .. (i+1) H/W - 1, but the result is assembled (B, H/W, W, n, d), head index before block
index, so head h lands where head (h mod W) H/W + h // W belongs.
"""

import torch
import torch.distributed as dist

CAUGHT_BY = {
    "check_ulysses": "the heads come back interleaved",
}


def heads_to_seq(y):
    W = dist.get_world_size()
    B, Hw, T, d = y.shape
    n = T // W
    send = y.reshape(B, Hw, W, n, d).permute(2, 0, 1, 3, 4).contiguous()
    recv = torch.empty_like(send)
    dist.all_to_all_single(recv, send)
    return recv.permute(1, 2, 0, 3, 4).reshape(B, Hw * W, n, d)  # wrong: (Hw, W) order
