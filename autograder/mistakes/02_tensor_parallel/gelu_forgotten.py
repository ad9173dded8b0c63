"""Mistake: the TP MLP without its GeLU.

The shards, the collectives and the shapes are all right, so nothing crashes: the output is
fc2(fc1(x)), a linear map, and every gradient follows from it. The check recognises that
output and says what is missing.

Replaces TPMLP (exercise 3); ColumnParallelLinear and RowParallelLinear are the learner's.
"""

import torch.nn as nn

CAUGHT_BY = {
    "check_tp_mlp": "the MLP without its GeLU",
}


class TPMLP(nn.Module):
    def __init__(self, mlp):
        super().__init__()
        self.fc1 = ColumnParallelLinear(mlp.fc1)  # noqa: F821
        self.fc2 = RowParallelLinear(mlp.fc2)  # noqa: F821

    def forward(self, x):
        return self.fc2(self.fc1(x))  # wrong: no F.gelu in between
