"""Mistake: the TP MLP applies g to the output of the row-parallel layer, which already did.

RowParallelLinear's forward ends with g, the all-reduce that sums the partial products. A
second g sums t copies of the finished, replicated output: the forward is exactly t times the
MLP's (2x on 2 ranks). g's backward is the identity, so the gradients stay right, and only the
output shows the mistake.

Replaces TPMLP (exercise 3); ColumnParallelLinear, RowParallelLinear and g are the learner's.
"""

import torch.nn as nn
import torch.nn.functional as F

CAUGHT_BY = {
    "check_tp_mlp": "RowParallelLinear already applies g",
}


class TPMLP(nn.Module):
    def __init__(self, mlp):
        super().__init__()
        self.fc1 = ColumnParallelLinear(mlp.fc1)  # noqa: F821
        self.fc2 = RowParallelLinear(mlp.fc2)  # noqa: F821

    def forward(self, x):
        return g(self.fc2(F.gelu(self.fc1(x))))  # noqa: F821 - wrong: fc2 already applied g
