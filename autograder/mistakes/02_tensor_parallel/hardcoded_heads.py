"""Mistake: TP attention with the heads per rank written in from the notebook's example.

With 4 heads, 4 // t is the right count on 2 and on 4 ranks, so checks that only use 4 heads
pass. The check's attention has 12 heads: 4 // t gives 2 heads per rank on 2 ranks (6 are
right), so each rank splits its features into too few, too wide heads. The check recognises
the output of attention with another head count.

Replaces TPAttention (exercise 5); ColumnParallelLinear and RowParallelLinear are the
learner's.
"""

import copy

import torch
import torch.distributed as dist
import torch.nn as nn

from parlab.model import attention_heads

CAUGHT_BY = {
    "check_tp_attention": "heads per rank",
}


class TPAttention(nn.Module):
    def __init__(self, attn):
        super().__init__()
        t = dist.get_world_size()
        if attn.n_heads % t:
            raise ValueError(f"n_heads = {attn.n_heads} is not divisible by t = {t}")
        self.local_heads, self.causal = 4 // t, attn.causal  # wrong: the example's 4 heads
        h = attn.qkv.in_features
        c = h // t
        order = torch.arange(3 * h).reshape(3, t, c).transpose(0, 1).reshape(-1)
        heads_first = copy.deepcopy(attn.qkv)
        with torch.no_grad():
            heads_first.weight.copy_(attn.qkv.weight[order])
            heads_first.bias.copy_(attn.qkv.bias[order])
        self.qkv = ColumnParallelLinear(heads_first)  # noqa: F821
        self.proj = RowParallelLinear(attn.proj)  # noqa: F821

    def forward(self, x):
        q, k, v = self.qkv(x).chunk(3, dim=-1)
        return self.proj(attention_heads(q, k, v, self.local_heads, causal=self.causal))
