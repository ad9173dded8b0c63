"""Mistake: the all-to-all's output buffer made with torch.empty(shape), float32.

Replaces the exercise-5 answer's `seq_to_heads`. The tensors are float64; gloo refuses an
output of another dtype (ValueError: "Invalid usage of tensors with different dtypes"). The
check names the buffer rule instead of leaving the learner with gloo's words alone.
"""

import torch
import torch.distributed as dist

CAUGHT_BY = {
    "check_ulysses": "needs an output of the input's size and dtype",
}


def seq_to_heads(x):
    W = dist.get_world_size()
    B, H, n, d = x.shape
    send = x.reshape(B, W, H // W, n, d).transpose(0, 1).contiguous()
    recv = torch.empty(send.shape)  # wrong: float32 whatever x's dtype
    dist.all_to_all_single(recv, send)
    return recv.permute(1, 2, 0, 3, 4).reshape(B, H // W, W * n, d)
