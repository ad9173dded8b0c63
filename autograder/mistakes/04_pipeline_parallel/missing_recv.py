"""Mistake: backward_step never receives the gradient of its output from the next stage; it
backpropagates a gradient of ones instead.

Every rank but the last computes wrong gradients, and the next stage's isend is never
matched. Replaces backward_step (exercise 2).
"""

import torch
import torch.distributed as dist

CAUGHT_BY = {
    "check_p2p_step": "a missing recv",
}


def backward_step(ctx, mb):
    x, y = ctx.saved.pop(mb)
    if ctx.is_last:
        y.backward()
    else:
        y.backward(torch.ones_like(y))  # should be the gradient received from ctx.next_rank
    if not ctx.is_first:
        ctx.sends.append(dist.isend(x.grad, dst=ctx.prev_rank))
