"""Mistake: the reshuffles hard-code W = 2 ranks (the visible check's size).

Replaces both exercise-5 functions. On 2 ranks they are right; on 3 and 4 the exchange runs
on a (2, ...) tensor and returns the shapes of 2 ranks (or the next reshape fails). The check
runs on 4 ranks too (and 3 hidden), compares the shape in the rank before anything else uses
it, and says the shapes are those of 2 ranks.
"""

import torch
import torch.distributed as dist

CAUGHT_BY = {
    "check_ulysses": "read W from dist.get_world_size()",
}
WORLD_SIZES = (3, 4)  # right on 2 ranks


def seq_to_heads(x):
    W = 2  # wrong: dist.get_world_size()
    B, H, n, d = x.shape
    send = x.reshape(B, W, H // W, n, d).transpose(0, 1).contiguous()
    recv = torch.empty_like(send)
    dist.all_to_all_single(recv, send)
    return recv.permute(1, 2, 0, 3, 4).reshape(B, H // W, W * n, d)


def heads_to_seq(y):
    W = 2  # wrong
    B, Hw, T, d = y.shape
    n = T // W
    send = y.reshape(B, Hw, W, n, d).permute(2, 0, 1, 3, 4).contiguous()
    recv = torch.empty_like(send)
    dist.all_to_all_single(recv, send)
    return recv.transpose(0, 1).reshape(B, W * Hw, n, d)
