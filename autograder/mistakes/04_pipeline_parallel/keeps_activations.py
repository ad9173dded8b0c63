"""Mistake: backward_step reads its microbatch from ctx.saved without removing it.

The gradients are right, but every rank keeps every microbatch's activations until the end
of the step: under 1F1B rank r holds m microbatches instead of min(p - r, m), GPipe's
memory. Replaces backward_step (exercise 2).
"""

import torch
import torch.distributed as dist

CAUGHT_BY = {
    "check_p2p_step": "1F1B saves memory only if each backward frees what its forward saved",
}


def backward_step(ctx, mb):
    x, y = ctx.saved[mb]  # should be ctx.saved.pop(mb)
    if ctx.is_last:
        y.backward()
    else:
        grad = torch.empty(ctx.shape, dtype=ctx.dtype)
        dist.recv(grad, src=ctx.next_rank)
        y.backward(grad)
    if not ctx.is_first:
        ctx.sends.append(dist.isend(x.grad, dst=ctx.prev_rank))
