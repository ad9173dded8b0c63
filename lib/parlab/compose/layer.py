r"""One Llama layer under TP, TP + SP, CP and EP: this rank's share of a `LlamaBlock`.

    layer = ParallelBlock(block, grid, sequence_parallel=True)
    x = layer(x, pos)              # x (B, n/t, C) with SP, (B, n, C) without; n = T/cp

Megatron's split (Shoeybi et al. 2019, arXiv:1909.08053; Korthikanti et al. 2022,
arXiv:2205.05198), with the operators of `parlab.tp.mappings`:

    attention:  h = attn_norm(x)                       # on this rank's tokens (SP) or all
                h = enter(h)                           # SP: all-gather T/cp tokens; TP: f
                q = h wq_r^T (H/t heads), k, v = h wk_r^T, h wv_r^T (H_kv/t heads)
                q, k = rope(q, k, global positions)    # a CP rank's own positions
                y = attention(q, k, v)                 # CP: ring attention over the cp group
                x = x + leave(y wo_r^T)                # SP: reduce-scatter; TP: g (all-reduce)
    MLP:        x = x + leave(swiglu(enter(mlp_norm(x)), gate_r, up_r, down_r))
    MoE:        x = x + ExpertParallelMoE(mlp_norm(x))  # own tokens, experts over ep

wq, wk, wv are column-parallel by whole heads (t must divide H and H_kv: rank r holds query
heads $rH/t..$ and exactly the KV heads they read), wo and down row-parallel, gate and up
column-parallel; no biases, so nothing is added after a reduce-scatter. With CP, attention
runs `parlab.cp.ring_attention` on the rank's heads: each CP rank's queries meet every CP
rank's keys, masked by the global positions in `pos.table`; K and V are expanded to the
query heads first (GQA), so the ring carries H/t heads (simple; a ring of H_kv/t heads
would move H/H_kv times fewer bytes).

Under SP the RMSNorm weights see only this rank's tokens: their gradients are partial sums
over TP, listed by `sequence_parallel_params` and summed after backward
(`parlab.tp.allreduce_sequence_parallel_grads`), as are the MoE layer's.
"""

from __future__ import annotations

import copy

import torch.nn.functional as F
from torch import Tensor, nn

from parlab.compose.experts import ExpertParallelMoE
from parlab.compose.grid import Grid, Positions
from parlab.cp.ring import ring_attention
from parlab.model.llama import (
    Attention,
    LlamaBlock,
    MoESwiGLU,
    SwiGLU,
    apply_rope,
    expand_kv,
    rope_angles,
    swiglu,
)
from parlab.tp.mappings import (
    copy_to_tp_region,
    divisible,
    gather_from_sequence_parallel_region,
    reduce_from_tp_region,
    reduce_scatter_to_sequence_parallel_region,
)
from parlab.tp.sequence import column_shard, row_shard

__all__ = ["ParallelAttention", "ParallelSwiGLU", "ParallelBlock"]


class ParallelAttention(nn.Module):
    """Rank r's heads: wq (HD/t, C), wk and wv (H_kv D/t, C), wo (C, HD/t)."""

    def __init__(self, attn: Attention, grid: Grid) -> None:
        super().__init__()
        t, tp = grid.size("tp"), grid.tp
        self.grid = grid
        self.heads = divisible(attn.heads, t, "heads", "use a number of heads that t divides")
        self.kv_heads = divisible(attn.kv_heads, t, "kv_heads",
                                  "every TP rank needs whole KV heads: use kv_heads that t "
                                  "divides")
        self.head_dim, self.theta = attn.head_dim, attn.theta
        self.wq, self.wk = column_shard(attn.wq, group=tp), column_shard(attn.wk, group=tp)
        self.wv, self.wo = column_shard(attn.wv, group=tp), row_shard(attn.wo, group=tp)

    def forward(self, h: Tensor, pos: Positions) -> Tensor:  # (B, n, C) -> partial (B, n, C)
        B, n, _ = h.shape
        d, g = self.head_dim, self.heads // self.kv_heads
        q = self.wq(h).view(B, n, self.heads, d).transpose(1, 2)  # (B, H/t, n, D)
        k = self.wk(h).view(B, n, self.kv_heads, d).transpose(1, 2)  # (B, H_kv/t, n, D)
        v = self.wv(h).view(B, n, self.kv_heads, d).transpose(1, 2)
        cos, sin = rope_angles(pos.cp, d, theta=self.theta)  # the global positions
        q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
        k, v = expand_kv(k, g), expand_kv(v, g)  # (B, H/t, n, D)
        if self.grid.size("cp") == 1:
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        else:
            y = ring_attention(q, k, v, pos.table, causal=True, group=self.grid.cp)
        return self.wo(y.transpose(1, 2).reshape(B, n, self.heads * d))  # partial sums


class ParallelSwiGLU(nn.Module):
    """gate and up column-parallel (F/t, C), down row-parallel (C, F/t)."""

    def __init__(self, mlp: SwiGLU, grid: Grid) -> None:
        super().__init__()
        tp = grid.tp
        self.gate, self.up = column_shard(mlp.gate, group=tp), column_shard(mlp.up, group=tp)
        self.down = row_shard(mlp.down, group=tp)

    def forward(self, h: Tensor) -> Tensor:  # (B, n, C) -> partial (B, n, C)
        return swiglu(h, self.gate.weight, self.up.weight, self.down.weight)


class ParallelBlock(nn.Module):
    """This rank's share of a LlamaBlock; input and output (B, n/t, C) with SP, else (B, n, C)."""

    def __init__(self, block: LlamaBlock, grid: Grid, *, sequence_parallel: bool) -> None:
        super().__init__()
        self.grid, self.sequence_parallel = grid, sequence_parallel
        self.attn_norm = copy.deepcopy(block.attn_norm)
        self.mlp_norm = copy.deepcopy(block.mlp_norm)
        self.attn = ParallelAttention(block.attn, grid)
        self.mlp: nn.Module
        if isinstance(block.mlp, MoESwiGLU):
            if grid.size("tp") > 1 and not sequence_parallel:
                raise ValueError("a MoE layer with tensor parallelism needs sequence "
                                 "parallelism (as in Megatron): turn --sequence-parallel on")
            self.mlp = ExpertParallelMoE(block.mlp, grid, sequence_parallel=sequence_parallel)
        else:
            assert isinstance(block.mlp, SwiGLU)
            self.mlp = ParallelSwiGLU(block.mlp, grid)

    def _enter(self, h: Tensor) -> Tensor:  # SP: (B, n/t, C) -> (B, n, C); TP: f
        if self.sequence_parallel:
            return gather_from_sequence_parallel_region(h, group=self.grid.tp)
        return copy_to_tp_region(h, group=self.grid.tp)

    def _leave(self, partial: Tensor) -> Tensor:  # (B, n, C) partial sums
        if self.sequence_parallel:
            return reduce_scatter_to_sequence_parallel_region(partial, group=self.grid.tp)
        return reduce_from_tp_region(partial, group=self.grid.tp)

    def forward(self, x: Tensor, pos: Positions) -> Tensor:
        x = x + self._leave(self.attn(self._enter(self.attn_norm(x)), pos))
        h = self.mlp_norm(x)
        if isinstance(self.mlp, ExpertParallelMoE):
            return x + self.mlp(h, pos)  # this rank's tokens, experts over the ep group
        return x + self._leave(self.mlp(self._enter(h)))

    def sequence_parallel_params(self) -> list[nn.Parameter]:
        """Parameters whose gradients are partial sums over TP (empty without SP)."""
        if not self.sequence_parallel:
            return []
        params = [self.attn_norm.weight, self.mlp_norm.weight]
        return params + (list(self.mlp.parameters())
                         if isinstance(self.mlp, ExpertParallelMoE) else [])
