r"""Tensor-parallel attention (split by heads) and a tensor-parallel transformer layer.

Heads never interact until the output projection, so rank i keeps whole heads: the Q, K and V
features of heads $i\frac{n}{t}$ to $(i+1)\frac{n}{t}-1$ (column-parallel), runs attention on
them locally, and the output projection is row-parallel, closing with the one all-reduce (g).
The number of heads n, and so the hidden size, must be divisible by t.

The single-device `Attention` keeps Q, K and V in one fused Linear whose output features are
laid out [Q; K; V] (each C wide, head h in features h*d:(h+1)*d). A contiguous block of its
rows is NOT one rank's heads, so `TPAttention.from_attention` first reorders the rows to
[Q_0; K_0; V_0; Q_1; K_1; V_1; ...] (`heads_first_qkv`) and then takes an ordinary column shard.

A layer (pre-LayerNorm) is x + attn(ln1(x)), then x + mlp(ln2(x)). Under TP the LayerNorms and
residual adds are replicated; per layer there are 2 all-reduces forward (g after attention and
after the MLP) and 2 backward (f before each): $16\frac{t-1}{t}bsh$ bytes in bf16
(`parlab.costs.tp_bytes_per_layer`).
"""

from __future__ import annotations

import copy

import torch
import torch.distributed as dist
from torch import Tensor, nn

from parlab.model.transformer import Attention, Block, attention_heads
from parlab.tp.layers import TPMLP, ColumnParallelLinear, RowParallelLinear
from parlab.tp.mappings import divisible, tp_rank_and_size

__all__ = ["heads_first_qkv", "TPAttention", "TPBlock"]


def heads_first_qkv(qkv: nn.Linear, t: int) -> nn.Linear:
    """A copy of a fused [Q; K; V] Linear with rows reordered to [Q_0; K_0; V_0; Q_1; ...].

    Block i (3C/t rows) then holds exactly the Q, K and V features of rank i's heads, so an
    ordinary column shard of the copy is rank i's share of attention.
    """
    C = qkv.in_features
    per = divisible(C, t, "hidden", "pick a hidden size that t divides")
    idx = torch.arange(3 * C, device=qkv.weight.device).reshape(3, t, per)  # (qkv, rank, feat)
    order = idx.transpose(0, 1).reshape(-1)  # rank-major: rank i's Q, K, V rows together
    out = nn.Linear(C, 3 * C, bias=qkv.bias is not None, device=qkv.weight.device,
                    dtype=qkv.weight.dtype)
    with torch.no_grad():
        out.weight.copy_(qkv.weight[order])
        if qkv.bias is not None:
            out.bias.copy_(qkv.bias[order])
    return out


class TPAttention(nn.Module):
    """Attention split by heads: qkv column-parallel (heads first), proj row-parallel.

    This rank runs n_heads/t heads; one all-reduce in forward (in proj), one in backward (f in
    qkv). Raises ValueError when t does not divide n_heads.
    """

    def __init__(self, qkv: ColumnParallelLinear, proj: RowParallelLinear, n_heads: int, *,
                 causal: bool = True):
        super().__init__()
        t = qkv.t
        self.local_heads = divisible(n_heads, t, "n_heads", (
            f"use a number of heads that t divides (e.g. {t * max(1, n_heads // t)}) or a t "
            f"that divides {n_heads}: TP gives each rank whole heads"))
        self.qkv, self.proj, self.n_heads, self.causal = qkv, proj, n_heads, causal

    @classmethod
    def from_attention(cls, attn: Attention, *,
                       group: dist.ProcessGroup | None = None) -> TPAttention:
        """This rank's heads of a single-device `Attention`."""
        _, t = tp_rank_and_size(group)
        C = attn.qkv.in_features
        divisible(attn.n_heads, t, "n_heads",
                  f"use a number of heads that t divides, or a t that divides {attn.n_heads}: "
                  "TP gives each rank whole heads")
        divisible(C, t, "hidden", "pick a hidden size that t divides")
        qkv = ColumnParallelLinear.from_linear(heads_first_qkv(attn.qkv, t), group=group)
        proj = RowParallelLinear.from_linear(attn.proj, group=group)
        return cls(qkv, proj, attn.n_heads, causal=attn.causal)

    def forward(self, x: Tensor) -> Tensor:  # (B, T, C), replicated
        q, k, v = self.qkv(x).chunk(3, dim=-1)  # 3 x (B, T, C/t): this rank's heads
        y = attention_heads(q, k, v, self.local_heads, causal=self.causal)  # (B, T, C/t)
        return self.proj(y)  # (B, T, C): all-reduced, replicated


class TPBlock(nn.Module):
    """A `Block` under TP: LayerNorms and residuals replicated, attention and MLP split."""

    def __init__(self, ln1: nn.LayerNorm, attn: TPAttention, ln2: nn.LayerNorm, mlp: TPMLP):
        super().__init__()
        self.ln1, self.attn, self.ln2, self.mlp = ln1, attn, ln2, mlp

    @classmethod
    def from_block(cls, block: Block, *, group: dist.ProcessGroup | None = None) -> TPBlock:
        return cls(copy.deepcopy(block.ln1), TPAttention.from_attention(block.attn, group=group),
                   copy.deepcopy(block.ln2), TPMLP.from_mlp(block.mlp, group=group))

    def forward(self, x: Tensor) -> Tensor:  # (B, T, C), replicated
        x = x + self.attn(self.ln1(x))  # g: 1 all-reduce forward; f: 1 backward
        return x + self.mlp(self.ln2(x))  # the same again
