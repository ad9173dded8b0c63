"""Mistake: the TP layer adds its residuals in place, changing the caller's tensor.

`x += self.attn(self.ln1(x))` writes into the tensor the caller passed in. The output is
right, but the caller's activation is gone (in a model, the previous layer's output, which its
own backward may still need). The check gives the layer a copy and compares it afterwards.

Replaces TPBlock (exercise 6, its layer_bytes stays the learner's); TPAttention and TPMLP are
the learner's.
"""

import torch.nn as nn

CAUGHT_BY = {
    "check_tp_block": "modified its input x",
}


class TPBlock(nn.Module):
    def __init__(self, block):
        super().__init__()
        self.ln1, self.ln2 = block.ln1, block.ln2
        self.attn = TPAttention(block.attn)  # noqa: F821
        self.mlp = TPMLP(block.mlp)  # noqa: F821

    def forward(self, x):
        x += self.attn(self.ln1(x))  # wrong: in place, into the caller's tensor
        return x + self.mlp(self.ln2(x))
