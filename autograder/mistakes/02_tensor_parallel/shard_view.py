"""Mistake: the column-parallel layer keeps a view of the full weight instead of a copy.

linear.weight.detach()[rows] is a view: its storage is the whole (out_features, in_features)
weight. Every value is right, but each rank keeps the full weight alive through its "shard",
which is the memory tensor parallelism is meant to save. The check asks every shard parameter
to own its storage.

Replaces ColumnParallelLinear (exercise 2); f is the learner's.
"""

import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F

CAUGHT_BY = {
    "check_parallel_linears": "is a view of a",
    "check_tp_mlp": "is a view of a",
}


class ColumnParallelLinear(nn.Module):
    def __init__(self, linear):
        super().__init__()
        rank, t = dist.get_rank(), dist.get_world_size()
        n = linear.out_features // t
        rows = slice(rank * n, (rank + 1) * n)
        self.weight = nn.Parameter(linear.weight.detach()[rows])  # wrong: no .clone()
        self.bias = nn.Parameter(linear.bias.detach()[rows])  # wrong: no .clone()

    def forward(self, x):
        return F.linear(f(x), self.weight, self.bias)  # noqa: F821
