"""Mistake: the TP MLP applies f to its input, and ColumnParallelLinear applies it again.

f is the identity in forward, so the output is right. In backward each f all-reduces the
input gradient: the second sums t copies of what is already the sum, so the input gradient is
t times too large, while every weight gradient is right. The same factor t comes from g's
backward all-reducing (allreduce_twice.py), but then the weight gradients are t times too
large as well: the check tells the two apart and blames f.

Replaces TPMLP (exercise 3); f, ColumnParallelLinear and RowParallelLinear are the learner's.
"""

import torch.nn as nn
import torch.nn.functional as F

CAUGHT_BY = {
    "check_tp_mlp": "so f is applied twice",
    "check_tp_block": "f applied again",
}


class TPMLP(nn.Module):
    def __init__(self, mlp):
        super().__init__()
        self.fc1 = ColumnParallelLinear(mlp.fc1)  # noqa: F821
        self.fc2 = RowParallelLinear(mlp.fc2)  # noqa: F821

    def forward(self, x):
        return self.fc2(F.gelu(self.fc1(f(x))))  # noqa: F821 - wrong: fc1 already applies f
