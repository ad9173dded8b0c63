"""Mistake: TP attention with the hidden size written in as the visible test's C = 48.

The exercise says to take every size from attn; `h = 48` instead of attn.qkv.in_features is
right for the visible test's Attention(48, 12) on any t, and wrong for any other: the hidden
test uses Attention(40, 10) on 2 ranks, where the head-first row order of 3 * 48 rows runs past
the 120 rows of qkv.

Replaces TPAttention (exercise 5); ColumnParallelLinear and RowParallelLinear are the
learner's.
"""

import copy

import torch
import torch.distributed as dist
import torch.nn as nn

from parlab.model import attention_heads

CAUGHT_BY = {"check_tp_attention_other_sizes": "take every size from attn"}


class TPAttention(nn.Module):
    def __init__(self, attn):
        super().__init__()
        t = dist.get_world_size()
        h, n_heads = 48, attn.n_heads  # wrong: h = attn.qkv.in_features
        if n_heads % t:
            raise ValueError(f"n_heads = {n_heads} is not divisible by t = {t}")
        self.local_heads, self.causal = n_heads // t, attn.causal
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
