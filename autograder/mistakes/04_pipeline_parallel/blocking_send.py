"""Mistake: forward_step sends its activation with the blocking dist.send.

Under GPipe this happens to work; under 1F1B rank r blocks sending an activation to rank
r + 1 while rank r + 1 blocks sending a gradient to rank r, and both wait forever. Replaces
forward_step (exercise 2).
"""

import torch
import torch.distributed as dist

CAUGHT_BY = {
    "check_p2p_step": "dist.send waits until the peer has received",
}


def forward_step(ctx, mb):
    if ctx.is_first:
        x = ctx.inputs[mb]
    else:
        x = torch.empty(ctx.shape, dtype=ctx.dtype)
        dist.recv(x, src=ctx.prev_rank)
        x.requires_grad_()
    y = ctx.stage(x)
    if ctx.is_last:
        y = ctx.loss_fn(y, ctx.targets[mb]) / ctx.m
        ctx.losses.append(y.detach())
    else:
        dist.send(y.detach(), dst=ctx.next_rank)  # blocks until the next rank receives
    ctx.saved[mb] = (x, y)
