"""Mistake: the shard size written in from the visible test's layers, 24 // t.

`n = 24 // t` rows (column layer) and `k = 24 // t` columns (row layer) are right for
Linear(10, 24) and Linear(24, 10), the layers of the visible test, and wrong for any other: the
hidden test uses Linear(7, 15) and Linear(15, 7) on 3 ranks, where 24 // 3 = 8 is not 15 // 3.

Replaces ColumnParallelLinear and RowParallelLinear (exercise 2).
"""

import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F

CAUGHT_BY = {"check_parallel_linears_other_sizes": "never a fixed number"}


class ColumnParallelLinear(nn.Module):
    def __init__(self, linear):
        super().__init__()
        rank, t = dist.get_rank(), dist.get_world_size()
        n = 24 // t  # wrong: linear.out_features // t
        rows = slice(rank * n, (rank + 1) * n)
        self.weight = nn.Parameter(linear.weight.detach()[rows].clone())
        self.bias = nn.Parameter(linear.bias.detach()[rows].clone())

    def forward(self, x):
        return F.linear(f(x), self.weight, self.bias)  # noqa: F821


class RowParallelLinear(nn.Module):
    def __init__(self, linear):
        super().__init__()
        rank, t = dist.get_rank(), dist.get_world_size()
        k = 24 // t  # wrong: linear.in_features // t
        self.weight = nn.Parameter(linear.weight.detach()[:, rank * k:(rank + 1) * k].clone())
        self.bias = nn.Parameter(linear.bias.detach().clone())

    def forward(self, x):
        return g(F.linear(x, self.weight)) + self.bias  # noqa: F821
