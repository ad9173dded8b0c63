"""Mistake: seq_to_heads's all-to-all splits the head width d instead of the heads.

Replaces the exercise-5 answer's `seq_to_heads`. The shapes divide and the exchange runs:
each rank ends with every token of every head, but only d/W of each head's features, and a
score q . k needs all of them. The check compares the result with the slice of the full
tensor and names the dimension that was split.
"""

import torch
import torch.distributed as dist

CAUGHT_BY = {
    "check_ulysses": "split the head size D (dimension 3), not the heads",
}
WORLD_SIZES = (2, 4)  # head size 4: on 3 ranks the reshape itself fails


def seq_to_heads(x):
    W = dist.get_world_size()
    B, H, n, d = x.shape
    send = x.reshape(B, H, n, W, d // W).permute(3, 0, 1, 2, 4).contiguous()
    recv = torch.empty_like(send)
    dist.all_to_all_single(recv, send)
    return recv.permute(1, 2, 0, 3, 4).reshape(B, H, W * n, d // W)
