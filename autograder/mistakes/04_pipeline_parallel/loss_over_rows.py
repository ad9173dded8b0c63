"""Mistake: the microbatch loss divided by the rows of a microbatch instead of by m.

Replaces forward_step (exercise 2). The last stage computes loss_fn(y, target) / x.shape[0]:
a per-row average on top of mse_loss's own. With the 16-row batch cut into m = 4 microbatches
on 2 ranks, a microbatch has 4 rows and the answer matched by accident; the check now runs
m = 2p + 1 microbatches of 3 rows, where the two numbers differ (issue 16.1 and 16.5: a size
no answer can special-case, a formula tested where the wrong form disagrees).
"""

import torch
import torch.distributed as dist

CAUGHT_BY = {
    "check_p2p_step": "not by 3, the rows of one microbatch",
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
        y = ctx.loss_fn(y, ctx.targets[mb]) / x.shape[0]  # wrong: rows, not ctx.m
        ctx.losses.append(y.detach())
    else:
        ctx.sends.append(dist.isend(y.detach(), dst=ctx.next_rank))
    ctx.saved[mb] = (x, y)
