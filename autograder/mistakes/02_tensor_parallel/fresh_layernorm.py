"""Mistake: the TP layer builds new LayerNorms instead of keeping the block's.

A fresh nn.LayerNorm has weight 1 and bias 0. A block at its default initialisation has
exactly those, so a check with default-initialised weights cannot tell the two apart; with
trained (here: randomised) LayerNorms the output is wrong. The check compares the layer's
LayerNorm parameters with the block's first.

Replaces TPBlock (exercise 6, its layer_bytes stays the learner's); TPAttention and TPMLP are
the learner's.
"""

import torch.nn as nn

CAUGHT_BY = {
    "check_tp_block": "is not the block's",
}


class TPBlock(nn.Module):
    def __init__(self, block):
        super().__init__()
        h = block.ln1.normalized_shape[0]
        self.ln1, self.ln2 = nn.LayerNorm(h), nn.LayerNorm(h)  # wrong: new LayerNorms
        self.attn = TPAttention(block.attn)  # noqa: F821
        self.mlp = TPMLP(block.mlp)  # noqa: F821

    def forward(self, x):
        x = x + self.attn(self.ln1(x))
        return x + self.mlp(self.ln2(x))
