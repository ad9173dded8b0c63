"""Mistake: the TP MLP in the swapped order, row-parallel fc1 then column-parallel fc2.

The output and the gradients are right, but it costs more: fc1's partial sums must be
all-reduced before the GeLU (an all-reduce of the (B, T, 4C) pre-activation), and fc2's
column-parallel output must be all-gathered. Two collectives in forward where column -> row
needs one all-reduce of (B, T, C).

Replaces TPMLP (exercise 3); f, ColumnParallelLinear and RowParallelLinear are the learner's.
"""

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F

CAUGHT_BY = {
    "check_tp_mlp": "row-parallel first needs an all-reduce before the GeLU",
}


class GatherLastDim(torch.autograd.Function):
    """forward: all-gather the last dimension; backward: keep this rank's slice."""

    @staticmethod
    def forward(ctx, x):
        t = dist.get_world_size()
        parts = [torch.empty_like(x) for _ in range(t)]
        dist.all_gather(parts, x.contiguous())
        return torch.cat(parts, dim=-1)

    @staticmethod
    def backward(ctx, grad):
        rank, t = dist.get_rank(), dist.get_world_size()
        n = grad.shape[-1] // t
        return grad[..., rank * n:(rank + 1) * n].contiguous()


class TPMLP(nn.Module):
    def __init__(self, mlp):
        super().__init__()
        self.fc1 = RowParallelLinear(mlp.fc1)  # noqa: F821 - wrong order: row first
        self.fc2 = ColumnParallelLinear(mlp.fc2)  # noqa: F821

    def forward(self, x):  # (B, T, C)
        rank, t = dist.get_rank(), dist.get_world_size()
        n = x.shape[-1] // t
        h = F.gelu(self.fc1(f(x)[..., rank * n:(rank + 1) * n]))  # noqa: F821 - all-reduce 4C
        return GatherLastDim.apply(self.fc2(h))  # a second collective: all-gather
