"""Mistake: seq_to_heads keeps this rank's heads of its own tokens and exchanges nothing.

Replaces seq_to_heads (exercise 5; heads_to_seq is right). The answer slices heads
r·H/W .. (r+1)·H/W - 1 out of the rank's n tokens: the right heads, but (B, H/W, n, D)
instead of every token of them, (B, H/W, W·n, D). The check sees that the sequence
dimension did not change and says so, not that a size was read wrong.
"""

import torch.distributed as dist

CAUGHT_BY = {
    "check_ulysses": "the sequence dimension did not change",
}


def seq_to_heads(x):
    W, r = dist.get_world_size(), dist.get_rank()
    H = x.shape[1]
    return x[:, r * H // W:(r + 1) * H // W].contiguous()  # wrong: no all-to-all
