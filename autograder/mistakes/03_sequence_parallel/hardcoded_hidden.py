"""Mistake: the TP + SP layer splits q, k and v with the example's hidden size written in.

`qkv.split(16 // t)` is right for a hidden size of 16, on 2 ranks and on 4, so checks at that
size pass. The check's layer has hidden 48: the split gives nine pieces, not three, and the
message says which sizes the check uses and to take them from the tensors.

Replaces SPBlock (exercise 3); gather_seq, reduce_scatter_seq and sp_dropout are the learner's.
"""

import copy

import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F

from parlab.model import attention_heads
from parlab.tp import column_shard, heads_first_qkv, row_shard

CAUGHT_BY = {
    "check_sp_block": "never from the notebook's example",
}


class SPBlock(nn.Module):
    """A DropoutBlock under TP + SP: this rank's tokens in, this rank's tokens out."""

    def __init__(self, block):  # given: this rank's shards, as in module 02
        super().__init__()
        t = dist.get_world_size()
        self.p_drop, self.causal = block.p_drop, block.attn.causal
        self.local_heads = block.attn.n_heads // t
        self.ln1, self.ln2 = copy.deepcopy(block.ln1), copy.deepcopy(block.ln2)  # whole
        self.qkv = column_shard(heads_first_qkv(block.attn.qkv, t))  # (3C/t, C): [Q_r; K_r; V_r]
        self.proj = row_shard(block.attn.proj)  # weight (C, C/t); bias (C,), whole
        self.fc1 = column_shard(block.mlp.fc1)  # weight (4C/t, C); bias (4C/t,)
        self.fc2 = row_shard(block.mlp.fc2)  # weight (C, 4C/t); bias (C,), whole

    def forward(self, x, generator):  # x: (B, T/t, C), this rank's tokens
        h = gather_seq(self.ln1(x))  # noqa: F821 - (B, T, C)
        t = dist.get_world_size()
        qkv = F.linear(h, self.qkv.weight, self.qkv.bias)
        q, k, v = qkv.split(16 // t, dim=-1)  # wrong: the example's hidden size 16
        y = attention_heads(q, k, v, self.local_heads, causal=self.causal)  # (B, T, C/t)
        a = reduce_scatter_seq(F.linear(y, self.proj.weight)) + self.proj.bias  # noqa: F821 - (B, T/t, C)
        x = x + sp_dropout(a, self.p_drop, generator)  # noqa: F821
        h = gather_seq(self.ln2(x))  # noqa: F821 - (B, T, C)
        u = F.gelu(F.linear(h, self.fc1.weight, self.fc1.bias))  # (B, T, 4C/t)
        m = reduce_scatter_seq(F.linear(u, self.fc2.weight)) + self.fc2.bias  # noqa: F821 - (B, T/t, C)
        return x + sp_dropout(m, self.p_drop, generator)  # noqa: F821 - (B, T/t, C)

    def reduce_replicated_grads(self):
        """After backward: sum over ranks the gradients of the parameters every rank holds whole
        but applied to its own tokens only."""
        for param in (*self.ln1.parameters(), *self.ln2.parameters(), self.proj.bias,
                      self.fc2.bias):
            dist.all_reduce(param.grad)  # each rank's tokens gave one term
