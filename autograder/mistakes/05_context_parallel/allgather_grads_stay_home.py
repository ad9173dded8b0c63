"""Mistake: the gather's backward keeps this rank's rows of the gradient, with no reduction.

Replaces exercise 6's `GatherKV`. The forward is right, so the output matches; in the
backward each rank keeps only its own queries' terms of dK and dV, where the owner of a key
needs the sum of every rank's terms (a reduce-scatter). dq stays right.
"""

import torch
import torch.distributed as dist

CAUGHT_BY = {
    "check_allgather": "the backward kept only this rank's rows of the gathered gradient",
}


class GatherKV(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, pos):
        parts = [torch.empty_like(x) for _ in range(dist.get_world_size())]
        dist.all_gather(parts, x.contiguous())
        order = torch.argsort(pos.flatten())
        ctx.save_for_backward(order)
        return torch.cat(parts, dim=2)[:, :, order]

    @staticmethod
    def backward(ctx, grad):
        (order,) = ctx.saved_tensors
        arrived = torch.empty_like(grad)
        arrived[:, :, order] = grad
        mine = arrived.chunk(dist.get_world_size(), dim=2)[dist.get_rank()]  # no reduction
        return mine.contiguous(), None
