"""Mistake: exercise 2's steps written for the two stages of the first visible run.

Replaces forward_step and backward_step: an activation is received from rank 0 and sent to
rank p - 1, and a gradient received from rank p - 1 and sent to rank 0, the first and the
last stage, instead of ctx.prev_rank and ctx.next_rank. On 2 ranks those are the neighbours;
from 3 on, a middle stage has neighbours that are neither. The check names the misdirected
message at the action that sent it.
"""

import torch
import torch.distributed as dist

CAUGHT_BY = {
    "check_p2p_step": "activations come from ctx.prev_rank and go to ctx.next_rank",
}
WORLD_SIZES = (3, 4)


def forward_step(ctx, mb):
    if ctx.is_first:
        x = ctx.inputs[mb]
    else:
        x = torch.empty(ctx.shape, dtype=ctx.dtype)
        dist.recv(x, src=0)  # wrong: ctx.prev_rank
        x.requires_grad_()
    y = ctx.stage(x)
    if ctx.is_last:
        y = ctx.loss_fn(y, ctx.targets[mb]) / ctx.m
        ctx.losses.append(y.detach())
    else:
        ctx.sends.append(dist.isend(y.detach(), dst=ctx.p - 1))  # wrong: ctx.next_rank
    ctx.saved[mb] = (x, y)


def backward_step(ctx, mb):
    x, y = ctx.saved.pop(mb)
    if ctx.is_last:
        y.backward()
    else:
        grad = torch.empty(ctx.shape, dtype=ctx.dtype)
        dist.recv(grad, src=ctx.p - 1)  # wrong: ctx.next_rank
        y.backward(grad)
    if not ctx.is_first:
        ctx.sends.append(dist.isend(x.grad, dst=0))  # wrong: ctx.prev_rank
