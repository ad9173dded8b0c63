"""TPAttention with the reordered copy of qkv built by views, (3, t, C/t, C) transposed to
(t, 3, C/t, C), instead of an index permutation of the rows; q, k and v split by a view of
the last dim as (3, C/t) and unbind instead of chunk; and a ValueError worded its own way (it
names the heads and what to change)."""

import copy

PASSES = ["check_tp_attention"]


class TPAttention(nn.Module):  # noqa: F821
    def __init__(self, attn):
        super().__init__()
        t = dist.get_world_size()  # noqa: F821
        h, n_heads = attn.qkv.in_features, attn.n_heads
        self.causal = attn.causal
        if n_heads % t != 0:
            raise ValueError(f"cannot split {n_heads} heads over {t} ranks: choose a number "
                             f"of heads divisible by {t}, or a TP size that divides {n_heads}")
        self.local_heads, c = n_heads // t, h // t
        reordered = copy.deepcopy(attn.qkv)
        with torch.no_grad():  # noqa: F821
            reordered.weight.copy_(attn.qkv.weight.view(3, t, c, h).transpose(0, 1)
                                   .reshape(3 * h, h))
            reordered.bias.copy_(attn.qkv.bias.view(3, t, c).transpose(0, 1).reshape(3 * h))
        self.qkv = ColumnParallelLinear(reordered)  # noqa: F821
        self.proj = RowParallelLinear(attn.proj)  # noqa: F821

    def forward(self, x):
        qkv = self.qkv(x)  # (B, T, 3C/t)
        q, k, v = qkv.view(*qkv.shape[:-1], 3, -1).unbind(-2)  # 3 x (B, T, C/t)
        y = attention_heads(q, k, v, self.local_heads, causal=self.causal)  # noqa: F821
        return self.proj(y)
