"""Mistake: the TP MLP with its layers swapped: fc1 row-parallel, fc2 column-parallel.

fc1's row-parallel shard has shape (4C, C/t) and expects this rank's slice of x, but it is
given the whole x: torch raises "mat1 and mat2 shapes cannot be multiplied". The fault is not
in either layer (both pass exercise 2): the check looks at the shapes of the two shards and
says that they are swapped.

Replaces TPMLP (exercise 3); ColumnParallelLinear and RowParallelLinear are the learner's.
"""

import torch.nn as nn
import torch.nn.functional as F

CAUGHT_BY = {
    "check_tp_mlp": "the layers are swapped",
}


class TPMLP(nn.Module):
    def __init__(self, mlp):
        super().__init__()
        self.fc1 = RowParallelLinear(mlp.fc1)  # noqa: F821 - wrong: the up-projection is
        self.fc2 = ColumnParallelLinear(mlp.fc2)  # noqa: F821 - column-parallel, fc2 row

    def forward(self, x):
        return self.fc2(F.gelu(self.fc1(x)))
