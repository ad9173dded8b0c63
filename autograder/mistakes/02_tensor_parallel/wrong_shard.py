"""Mistake: the column-parallel layer keeps COLUMNS of nn.Linear.weight.

"Column-parallel" names columns of A in Y = XA, but nn.Linear stores weight = A^T with shape
(out_features, in_features): a column block of A is a ROW block of weight. Keeping
weight[:, block] gives a (out_features, in_features / t) tensor that cannot multiply x.

Replaces ColumnParallelLinear (exercise 2); f comes from the learner's exercise 1.
"""

import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F

CAUGHT_BY = {
    "check_parallel_linears": "keeps a block of ROWS of linear.weight",
    "check_tp_mlp": "keeps a block of ROWS of linear.weight",
    "check_tp_attention": "keeps a block of ROWS of linear.weight",
}


class ColumnParallelLinear(nn.Module):
    def __init__(self, linear):
        super().__init__()
        rank, t = dist.get_rank(), dist.get_world_size()
        n = linear.in_features // t
        block = slice(rank * n, (rank + 1) * n)
        self.weight = nn.Parameter(linear.weight.detach()[:, block].clone())  # wrong: dim 1
        self.bias = nn.Parameter(linear.bias.detach().clone())

    def forward(self, x):
        return F.linear(f(x), self.weight, self.bias)  # noqa: F821 - the learner's f
