"""Mistake: the TP + SP layer builds new LayerNorms instead of keeping the block's.

The given __init__ deep-copies block.ln1 and block.ln2; this one makes fresh nn.LayerNorm
modules, weight 1 and bias 0. A block at its default initialisation has exactly those, so a
check with default weights passes it; with trained (here: randomised) LayerNorms the layer is
wrong. The check compares the layer's LayerNorm parameters with the block's first.

Replaces SPBlock (exercise 3); gather_seq, reduce_scatter_seq and sp_dropout are the learner's.
"""

import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F

from parlab.model import attention_heads
from parlab.tp import column_shard, heads_first_qkv, row_shard

CAUGHT_BY = {
    "check_sp_block": "is not the block's",
}


class SPBlock(nn.Module):
    """A DropoutBlock under TP + SP: this rank's tokens in, this rank's tokens out."""

    def __init__(self, block):  # given: this rank's shards, as in module 02
        super().__init__()
        t = dist.get_world_size()
        self.p_drop, self.causal = block.p_drop, block.attn.causal
        self.local_heads = block.attn.n_heads // t
        h = block.ln1.normalized_shape[0]
        self.ln1, self.ln2 = nn.LayerNorm(h), nn.LayerNorm(h)  # wrong: new LayerNorms
        self.qkv = column_shard(heads_first_qkv(block.attn.qkv, t))  # (3C/t, C): [Q_r; K_r; V_r]
        self.proj = row_shard(block.attn.proj)  # weight (C, C/t); bias (C,), whole
        self.fc1 = column_shard(block.mlp.fc1)  # weight (4C/t, C); bias (4C/t,)
        self.fc2 = row_shard(block.mlp.fc2)  # weight (C, 4C/t); bias (C,), whole

    def forward(self, x, generator):  # x: (B, T/t, C), this rank's tokens
        h = gather_seq(self.ln1(x))  # noqa: F821 - (B, T, C)
        q, k, v = F.linear(h, self.qkv.weight, self.qkv.bias).chunk(3, dim=-1)  # (B, T, C/t)
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
