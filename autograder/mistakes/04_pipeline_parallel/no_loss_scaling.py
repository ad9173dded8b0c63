"""Mistake: the last stage's microbatch loss is not divided by m.

The full batch's loss is the mean of the m microbatch losses; without 1/m the summed loss
and every accumulated gradient are m times too large. Replaces forward_step (exercise 2).
"""

import torch
import torch.distributed as dist

CAUGHT_BY = {
    "check_p2p_step": "scale each microbatch's loss by 1/m",
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
        y = ctx.loss_fn(y, ctx.targets[mb])  # missing: / ctx.m
        ctx.losses.append(y.detach())
    else:
        ctx.sends.append(dist.isend(y.detach(), dst=ctx.next_rank))
    ctx.saved[mb] = (x, y)
