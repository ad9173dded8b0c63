"""Mistake: seq_to_heads puts the received blocks in the wrong order, tokens interleaved.

Replaces the exercise-5 answer's `seq_to_heads`. The right heads arrive, but the received
(W, B, H/W, n, d) blocks are flattened with n before W, so the sequence reads token 0 of every
rank, then token 1 of every rank, ...: positions no longer match the causal mask.
"""

import torch
import torch.distributed as dist

CAUGHT_BY = {
    "check_ulysses": "the right heads, but the tokens interleaved",
}


def seq_to_heads(x):
    W = dist.get_world_size()
    B, H, n, d = x.shape
    send = x.reshape(B, W, H // W, n, d).transpose(0, 1).contiguous()
    recv = torch.empty_like(send)
    dist.all_to_all_single(recv, send)
    return recv.permute(1, 2, 3, 0, 4).reshape(B, H // W, W * n, d)  # wrong: n before W
