"""Mistake: the row-parallel layers are called as nn.Linear, bias included, before the
reduce-scatter.

row_shard keeps the WHOLE bias on every rank; calling self.proj(a) adds it to each rank's
partial sum, and the reduce-scatter then adds t copies of it.

Replaces SPBlock.forward (exercise 3).
"""

import torch.nn.functional as F

CAUGHT_BY = {
    "check_sp_block": "the bias is added on every rank before the reduce-scatter",
}


def forward(self, x, generator):
    h = gather_seq(self.ln1(x))  # noqa: F821
    q, k, v = F.linear(h, self.qkv.weight, self.qkv.bias).chunk(3, dim=-1)
    a = attention_heads(q, k, v, self.local_heads, causal=self.causal)  # noqa: F821
    a = reduce_scatter_seq(self.proj(a))  # noqa: F821 - wrong: bias t times
    x = x + sp_dropout(a, self.p_drop, generator)  # noqa: F821
    h = gather_seq(self.ln2(x))  # noqa: F821
    m = reduce_scatter_seq(self.fc2(F.gelu(self.fc1(h))))  # noqa: F821 - wrong: bias t times
    return x + sp_dropout(m, self.p_drop, generator)  # noqa: F821


SPBlock.forward = forward  # noqa: F821 - the learner's class
