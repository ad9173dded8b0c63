"""Mistake: the receive buffer made with torch.empty(ctx.shape), float32, for float64 data.

Replaces forward_step (exercise 2). The previous stage sends a float64 activation of 8 bytes
an element into a float32 buffer of 4: gloo cannot match the two sizes, the receiving
process aborts (SIGABRT) and its peer reads "Connection reset by peer", a message that says
nothing about the buffer. The check now looks at every point-to-point tensor before the
exchange and names the dtype (issue 16.7).
"""

import torch
import torch.distributed as dist

CAUGHT_BY = {
    "check_p2p_step": "torch.empty's default dtype is float32",
}


def forward_step(ctx, mb):
    if ctx.is_first:
        x = ctx.inputs[mb]
    else:
        x = torch.empty(ctx.shape)  # wrong: float32, the activations are float64
        dist.recv(x, src=ctx.prev_rank)
        x.requires_grad_()
    y = ctx.stage(x)
    if ctx.is_last:
        y = ctx.loss_fn(y, ctx.targets[mb]) / ctx.m
        ctx.losses.append(y.detach())
    else:
        ctx.sends.append(dist.isend(y.detach(), dst=ctx.next_rank))
    ctx.saved[mb] = (x, y)
