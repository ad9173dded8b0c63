r"""A transformer layer with hidden dropout, on one device and under TP or TP + SP.

`DropoutBlock` is the single-device reference: parlab.model.Block with a dropout on the
output of attention and of the MLP, before each residual addition:

    x = x + drop(attn(ln1(x)));  x = x + drop(mlp(ln2(x)))

Dropout draws its masks from a `torch.Generator` passed to forward, in that order (no
generator: no dropout), so a parallel layer given an identically seeded generator can draw
the very same masks.

`SPBlock.from_block(block, sequence_parallel=...)` is this rank's share of it:
- sequence_parallel=False (TP): input and output (B, T, C), the same on every rank; the
  LayerNorms, dropouts and residuals repeated on every rank; f enters and g (all-reduce)
  leaves attention and the MLP.
- sequence_parallel=True (TP + SP): input and output (B, T/t, C), this rank's tokens; the
  LayerNorms, dropouts and residuals on those tokens only; an all-gather enters and a
  reduce-scatter leaves attention and the MLP. After backward, call
  `allreduce_sequence_parallel_grads()`: the LayerNorms and the two biases added after a
  reduce-scatter got gradients from this rank's tokens only.
- regather (with sequence_parallel): False (the default) gathers the LayerNorm output and
  gives it to `F.linear`, whose autograd keeps the gathered (B, T, C) tensor for the weight
  gradient; True keeps only this rank's (B, T/t, C) shard and all-gathers it again in the
  backward pass, as Megatron-LM does (`parlab.tp.regather.gathered_linear`): two more
  all-gathers a layer, the QKV and fc1 inputs t times smaller.

Attention and the MLP are split as in module 02: qkv column-parallel by whole heads, proj
row-parallel, fc1 column-parallel, fc2 row-parallel; each row-parallel bias is added once,
after the sum. What autograd saves is labelled with `parlab.costs.region`: "LayerNorm",
"QKV and fc1 inputs", "attention", "MLP", "dropout".
"""

from __future__ import annotations

import copy

import torch.distributed as dist
import torch.nn.functional as F
from torch import Generator, Tensor, nn

from parlab.costs.activations import region
from parlab.model.transformer import Block, attention_heads
from parlab.tp.attention import heads_first_qkv
from parlab.tp.mappings import (
    copy_to_tp_region,
    divisible,
    gather_from_sequence_parallel_region,
    reduce_from_tp_region,
    reduce_scatter_to_sequence_parallel_region,
    tp_rank_and_size,
)
from parlab.tp.regather import gathered_linear
from parlab.tp.sequence import (
    allreduce_sequence_parallel_grads,
    column_shard,
    hidden_dropout,
    row_shard,
    sequence_parallel_dropout,
)

__all__ = ["DropoutBlock", "SPBlock"]


class DropoutBlock(Block):
    """Single-device reference: a pre-LayerNorm layer with hidden dropout, each element
    dropped with probability `p_drop`."""

    def __init__(self, hidden: int, n_heads: int, *, p_drop: float = 0.1,
                 causal: bool = True) -> None:
        super().__init__(hidden, n_heads, causal=causal)
        self.p_drop = p_drop

    def _drop(self, x: Tensor, generator: Generator | None) -> Tensor:
        if generator is None:
            return x
        with region("dropout"):
            return hidden_dropout(x, p_drop=self.p_drop, generator=generator)

    def forward(self, x: Tensor, generator: Generator | None = None) -> Tensor:  # (B, T, C)
        with region("LayerNorm"):
            h = self.ln1(x)
        x = x + self._drop(self.attn(h), generator)
        with region("LayerNorm"):
            h = self.ln2(x)
        return x + self._drop(self.mlp(h), generator)


class SPBlock(nn.Module):
    """This rank's share of a DropoutBlock under TP (sequence_parallel=False) or TP + SP.

    Parameters, flat: ln1, ln2 (whole), qkv (3C/t, C) rows [Q_r; K_r; V_r], proj (C, C/t) with
    its whole bias, fc1 (4C/t, C), fc2 (C, 4C/t) with its whole bias."""

    def __init__(self, block: DropoutBlock, *, group: dist.ProcessGroup | None = None,
                 sequence_parallel: bool = True, regather: bool = False) -> None:
        super().__init__()
        _, t = tp_rank_and_size(group)
        attn = block.attn
        self.local_heads = divisible(attn.n_heads, t, "n_heads",
                                     "use a number of heads that t divides")
        self.group, self.sequence_parallel = group, sequence_parallel
        self.regather = sequence_parallel and regather
        self.causal, self.p_drop = attn.causal, getattr(block, "p_drop", 0.0)
        self.ln1, self.ln2 = copy.deepcopy(block.ln1), copy.deepcopy(block.ln2)
        self.qkv = column_shard(heads_first_qkv(attn.qkv, t), group=group)
        self.proj = row_shard(attn.proj, group=group)
        self.fc1 = column_shard(block.mlp.fc1, group=group)
        self.fc2 = row_shard(block.mlp.fc2, group=group)

    @classmethod
    def from_block(cls, block: DropoutBlock, *, group: dist.ProcessGroup | None = None,
                   sequence_parallel: bool = True, regather: bool = False) -> SPBlock:
        return cls(block, group=group, sequence_parallel=sequence_parallel, regather=regather)

    def _enter(self, h: Tensor) -> Tensor:  # SP: (B, T/t, C) -> (B, T, C); TP: f
        if self.sequence_parallel:
            return gather_from_sequence_parallel_region(h, group=self.group)
        return copy_to_tp_region(h, group=self.group)

    def _leave(self, partial: Tensor, bias: Tensor | None) -> Tensor:  # (B, T, C) partial sums
        if self.sequence_parallel:
            out = reduce_scatter_to_sequence_parallel_region(partial, group=self.group)
        else:
            out = reduce_from_tp_region(partial, group=self.group)
        return out if bias is None else out + bias  # the bias once, after the sum

    def _drop(self, x: Tensor, generator: Generator | None) -> Tensor:
        if generator is None:
            return x
        with region("dropout"):
            if self.sequence_parallel:
                return sequence_parallel_dropout(x, p_drop=self.p_drop, generator=generator,
                                                 group=self.group)
            return hidden_dropout(x, p_drop=self.p_drop, generator=generator)

    def _column(self, h: Tensor, layer: nn.Linear) -> Tensor:
        """The column-parallel GEMM on the LayerNorm output h: gathered first (SP; f under TP),
        or gathered inside `gathered_linear`, which keeps only h's shard (regather)."""
        with region("QKV and fc1 inputs"):
            if self.regather:
                return gathered_linear(h, layer.weight, layer.bias, group=self.group)
            return F.linear(self._enter(h), layer.weight, layer.bias)

    def _attention(self, h: Tensor) -> Tensor:  # LayerNorm output -> (B, T, C) partial sums
        qkv = self._column(h, self.qkv)  # (B, T, 3C/t)
        with region("attention"):
            q, k, v = qkv.chunk(3, dim=-1)  # 3 x (B, T, C/t): this rank's heads
            y = attention_heads(q, k, v, self.local_heads, causal=self.causal)
            return F.linear(y, self.proj.weight)

    def _mlp(self, h: Tensor) -> Tensor:  # LayerNorm output -> (B, T, C) partial sums
        u = self._column(h, self.fc1)  # (B, T, 4C/t)
        with region("MLP"):
            return F.linear(F.gelu(u), self.fc2.weight)

    def forward(self, x: Tensor, generator: Generator | None = None) -> Tensor:
        # x: (B, T/t, C) this rank's tokens (SP) or (B, T, C) on every rank (TP)
        with region("LayerNorm"):
            h = self.ln1(x)
        a = self._leave(self._attention(h), self.proj.bias)
        x = x + self._drop(a, generator)
        with region("LayerNorm"):
            h = self.ln2(x)
        m = self._leave(self._mlp(h), self.fc2.bias)
        return x + self._drop(m, generator)  # same shape as the input

    def sequence_parallel_params(self) -> list[nn.Parameter]:
        """Parameters held whole but applied to this rank's tokens only (none under TP)."""
        if not self.sequence_parallel:
            return []
        params = [*self.ln1.parameters(), *self.ln2.parameters(), self.proj.bias,
                  self.fc2.bias]
        return [p for p in params if p is not None]

    def allreduce_sequence_parallel_grads(self) -> None:
        """After backward: sum the partial gradients of `sequence_parallel_params()`."""
        allreduce_sequence_parallel_grads(self.sequence_parallel_params(), group=self.group)
