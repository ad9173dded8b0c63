"""Mistake: the gathered weight stored on the layer and reused, so it outlives backward.

Forward gathers through an autograd op (forward all-gather, backward reduce-scatter) and keeps
the result as `self.full`: backward reuses it instead of refetching, and after backward the
layer still holds all P elements: the memory FSDP was meant to free.

Replaces FSDPLinear (exercise 2).
"""

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F

CAUGHT_BY = {"check_fsdp_layer": "the gathered weight is kept after backward"}


class _Gather(torch.autograd.Function):
    @staticmethod
    def forward(ctx, shard):
        return all_gather_flat(shard)  # noqa: F821 - the learner's exercise-2 helper

    @staticmethod
    def backward(ctx, grad):
        return reduce_scatter_flat(grad)  # noqa: F821


class FSDPLinear(nn.Module):
    def __init__(self, linear):
        super().__init__()
        rank, t = dist.get_rank(), dist.get_world_size()
        self.out_features, self.in_features = linear.out_features, linear.in_features
        flat = torch.cat([linear.weight.detach().flatten(), linear.bias.detach()])
        self.shard = nn.Parameter(take_shard(flat, rank, t))  # noqa: F821
        self.full = None

    def forward(self, x):
        self.full = _Gather.apply(self.shard)  # wrong: kept on the module
        n = self.out_features * self.in_features
        return F.linear(x, self.full[:n].view(self.out_features, self.in_features), self.full[n:])
