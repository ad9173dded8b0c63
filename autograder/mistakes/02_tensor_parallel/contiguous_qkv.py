"""Mistake: TP attention takes a contiguous block of rows of the fused qkv weight.

attn.qkv's output features are laid out [Q; K; V], C each. Rank 0's contiguous block of 3C/t
rows is, for t = 2, all of Q and the first half of K: not the Q, K and V of its own heads.
Each rank needs [Q_r; K_r; V_r].

Replaces TPAttention (exercise 5); ColumnParallelLinear and RowParallelLinear are the
learner's.
"""

import torch.distributed as dist
import torch.nn as nn

from parlab.model import attention_heads

CAUGHT_BY = {
    "check_tp_attention": "a contiguous block of 3C/t rows is not one rank's heads",
}


class TPAttention(nn.Module):
    def __init__(self, attn):
        super().__init__()
        t = dist.get_world_size()
        if attn.n_heads % t:
            raise ValueError(f"n_heads = {attn.n_heads} is not divisible by t = {t}")
        self.local_heads, self.causal = attn.n_heads // t, attn.causal
        self.qkv = ColumnParallelLinear(attn.qkv)  # noqa: F821 - wrong: rows not reordered
        self.proj = RowParallelLinear(attn.proj)  # noqa: F821

    def forward(self, x):
        q, k, v = self.qkv(x).chunk(3, dim=-1)
        return self.proj(attention_heads(q, k, v, self.local_heads, causal=self.causal))
