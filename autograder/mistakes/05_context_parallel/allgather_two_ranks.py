"""Mistake: the all-gather of exercise 6 makes room for two ranks' tokens.

Replaces the exercise-6 answer's `GatherKV`: `parts` holds 2 tensors, the ranks of the
visible check's first run, instead of dist.get_world_size(). Right on 2 ranks; from 3 on,
dist.all_gather refuses a list of the wrong length.
"""

import torch
import torch.distributed as dist

CAUGHT_BY = {
    "check_allgather": "read W from dist.get_world_size()",
}
WORLD_SIZES = (3, 4)


class GatherKV(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, pos):
        parts = [torch.empty_like(x) for _ in range(2)]  # wrong: dist.get_world_size()
        dist.all_gather(parts, x.contiguous())
        order = torch.argsort(pos.flatten())
        ctx.save_for_backward(order)
        return torch.cat(parts, dim=2)[:, :, order]

    @staticmethod
    def backward(ctx, grad):
        (order,) = ctx.saved_tensors
        arrived = torch.empty_like(grad)
        arrived[:, :, order] = grad
        parts = [p.contiguous() for p in arrived.chunk(2, dim=2)]  # wrong: W parts
        mine = torch.empty_like(parts[0])
        dist.reduce_scatter(mine, parts)
        return mine, None
