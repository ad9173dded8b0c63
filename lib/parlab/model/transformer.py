r"""The single-device transformer pieces every module shards: attention, the MLP, a layer.

These are the references: each parallel module of the course (`parlab.tp`, the checks, the
capstone's GPT) is checked against them with the same seeded weights.

- `attention_heads(q, k, v, n)`: scaled dot-product attention over n heads, (B, T, n·d).
- `Attention`: multi-head self-attention with one fused qkv projection whose output features
  are laid out [Q; K; V] (each C wide, head h in features h·d:(h+1)·d), then `proj`.
- `MLP`: fc2(GeLU(fc1(x))), hidden -> ffn (default 4·hidden) -> hidden.
- `Block`: a pre-LayerNorm layer, x + attn(ln1(x)), then x + mlp(ln2(x)).
"""

from __future__ import annotations

import torch.nn.functional as F
from torch import Tensor, nn

__all__ = ["attention_heads", "Attention", "MLP", "Block"]


def attention_heads(q: Tensor, k: Tensor, v: Tensor, n_heads: int, *, causal: bool) -> Tensor:
    """Scaled dot-product attention over n_heads heads: (B, T, n*d) x3 -> (B, T, n*d)."""
    B, T, C = q.shape
    d = C // n_heads
    q, k, v = (z.reshape(B, T, n_heads, d).transpose(1, 2) for z in (q, k, v))  # (B, n, T, d)
    y = F.scaled_dot_product_attention(q, k, v, is_causal=causal)  # (B, n, T, d)
    return y.transpose(1, 2).reshape(B, T, C)  # (B, T, n*d)


class Attention(nn.Module):
    """Single-device multi-head self-attention with a fused qkv projection (rows [Q; K; V])."""

    def __init__(self, hidden: int, n_heads: int, *, causal: bool = True, bias: bool = True):
        super().__init__()
        if hidden % n_heads:
            raise ValueError(f"hidden = {hidden} is not divisible by n_heads = {n_heads}: the "
                             "hidden size must be n_heads * head_dim")
        self.n_heads, self.causal = n_heads, causal
        self.qkv = nn.Linear(hidden, 3 * hidden, bias=bias)  # weight (3C, C)
        self.proj = nn.Linear(hidden, hidden, bias=bias)  # weight (C, C)

    def forward(self, x: Tensor) -> Tensor:  # (B, T, C)
        q, k, v = self.qkv(x).split(x.shape[-1], dim=-1)  # 3 x (B, T, C)
        return self.proj(attention_heads(q, k, v, self.n_heads, causal=self.causal))


class MLP(nn.Module):
    """Single-device reference: fc2(GeLU(fc1(x))), hidden -> ffn (default 4*hidden) -> hidden."""

    def __init__(self, hidden: int, *, ffn: int | None = None, bias: bool = True):
        super().__init__()
        self.fc1 = nn.Linear(hidden, ffn or 4 * hidden, bias=bias)  # weight (4h, h)
        self.fc2 = nn.Linear(ffn or 4 * hidden, hidden, bias=bias)  # weight (h, 4h)

    def forward(self, x: Tensor) -> Tensor:  # (B, T, C) -> (B, T, C)
        return self.fc2(F.gelu(self.fc1(x)))


class Block(nn.Module):
    """Single-device pre-LayerNorm transformer layer: attention then MLP, each residual."""

    def __init__(self, hidden: int, n_heads: int, *, causal: bool = True):
        super().__init__()
        self.ln1, self.ln2 = nn.LayerNorm(hidden), nn.LayerNorm(hidden)
        self.attn = Attention(hidden, n_heads, causal=causal)
        self.mlp = MLP(hidden)

    def forward(self, x: Tensor) -> Tensor:  # (B, T, C)
        x = x + self.attn(self.ln1(x))
        return x + self.mlp(self.ln2(x))
