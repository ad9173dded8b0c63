"""Mistake: TP attention with no check that t divides the number of heads.

With 3 heads on 2 ranks, n_heads // t = 1 head per rank silently drops a head's worth of
work (and mixes features of different heads). The layer must refuse, with a ValueError that
says what to change.

Replaces TPAttention (exercise 5): the solution without its divisibility check.
"""

import copy

import torch
import torch.distributed as dist
import torch.nn as nn

from parlab.model import attention_heads

CAUGHT_BY = {
    "check_tp_attention": "was accepted",
}


class TPAttention(nn.Module):
    def __init__(self, attn):
        super().__init__()
        t = dist.get_world_size()
        C = attn.qkv.in_features
        self.local_heads, self.causal = attn.n_heads // t, attn.causal  # wrong: no check
        c = C // t
        order = torch.arange(3 * C).reshape(3, t, c).transpose(0, 1).reshape(-1)
        heads_first = copy.deepcopy(attn.qkv)
        with torch.no_grad():
            heads_first.weight.copy_(attn.qkv.weight[order])
            heads_first.bias.copy_(attn.qkv.bias[order])
        self.qkv = ColumnParallelLinear(heads_first)  # noqa: F821
        self.proj = RowParallelLinear(attn.proj)  # noqa: F821

    def forward(self, x):
        q, k, v = self.qkv(x).chunk(3, dim=-1)
        return self.proj(attention_heads(q, k, v, self.local_heads, causal=self.causal))
