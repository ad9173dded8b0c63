"""Mistake: TP attention with the causal mask written in, causal=True, not attn.causal.

Every attention the checks built was causal, so this passed every test; an encoder's attention
(causal=False) would be masked all the same. The visible test's second call is Attention(40,
10) without the mask.

Replaces TPAttention (exercise 5); ColumnParallelLinear and RowParallelLinear are the
learner's.
"""

import copy

import torch
import torch.distributed as dist
import torch.nn as nn

from parlab.model import attention_heads

CAUGHT_BY = {"check_tp_attention_other_sizes": "the mask comes from the attention given"}


class TPAttention(nn.Module):
    def __init__(self, attn):
        super().__init__()
        t = dist.get_world_size()
        h, n_heads = attn.qkv.in_features, attn.n_heads
        if n_heads % t:
            raise ValueError(f"n_heads = {n_heads} is not divisible by t = {t}")
        self.local_heads = n_heads // t
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
        y = attention_heads(q, k, v, self.local_heads, causal=True)  # wrong: attn.causal
        return self.proj(y)
