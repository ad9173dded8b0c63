"""Mistake: the row-parallel layer adds its bias on every rank, before the all-reduce.

Each rank's partial product carries the whole bias, so the all-reduce sums t copies of it:
the output is off by (t - 1) * bias. The bias belongs after the all-reduce, added once.

Replaces RowParallelLinear (exercise 2); g comes from the learner's exercise 1.
"""

import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F

CAUGHT_BY = {
    "check_parallel_linears": "the bias is added on every rank",
    "check_tp_mlp": "the bias is added on every rank",
    "check_tp_attention": "the bias is added on every rank",
}


class RowParallelLinear(nn.Module):
    def __init__(self, linear):
        super().__init__()
        rank, t = dist.get_rank(), dist.get_world_size()
        n = linear.in_features // t
        self.weight = nn.Parameter(linear.weight.detach()[:, rank * n:(rank + 1) * n].clone())
        self.bias = nn.Parameter(linear.bias.detach().clone())

    def forward(self, x):
        return g(F.linear(x, self.weight, self.bias))  # noqa: F821 - wrong: bias inside g
