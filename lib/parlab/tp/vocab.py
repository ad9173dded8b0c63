r"""Vocabulary-parallel embedding and cross-entropy (after Megatron-LM's `VocabParallelEmbedding`
and `_VocabParallelCrossEntropy`): the V·h table and the logits split over the vocabulary.

Rank r of a group of t holds the rows $[rV'/t, (r+1)V'/t)$ of the table, where $V'$ is the
vocabulary padded as Megatron-LM pads it (`padded_vocab_size`: the smallest multiple of
`multiple`·t at least V; `--make-vocab-size-divisible-by` is 128 there, 1 here by default).
The padded rows are zero here and no id reaches them. The padded logits are excluded from the
loss (set to $-\infty$ before anything is reduced), so they never win the softmax: this
course's choice, made so that the loss equals `F.cross_entropy` over the real V exactly.
Megatron-LM does not mask them: its padded rows are initialised like the others
(`megatron/core/tensor_parallel/layers.py`, `VocabParallelEmbedding`), and its
`_VocabParallelCrossEntropy` (`megatron/core/tensor_parallel/cross_entropy.py`) takes the
maximum and the sum of exponentials over every column a rank holds, the padded ones included,
so its loss is a softmax over V' words, V' - V of which are never a target.

Embedding, forward: ids outside the shard look up row 0 and are zeroed, then the ranks' partial
outputs are all-reduced (`reduce_from_tp_region`, g: forward all-reduce, backward identity).

Cross-entropy over logits split by columns, $x_{i,j}$ for token i and word j, no gather:
$$\ell_i = \log\sum_j e^{x_{ij} - m_i} - (x_{i,y_i} - m_i), \qquad m_i = \max_j x_{ij},$$
three all-reduces of one number per token: the max (MAX), the target logit (SUM: only the rank
that holds $y_i$ adds it) and the sum of exponentials (SUM). Backward: softmax minus one-hot on
the local columns, no communication. The loss is the mean over tokens, as
`F.cross_entropy`'s default.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import Tensor, nn

from parlab.costs.activations import logits_bytes
from parlab.tp.mappings import reduce_from_tp_region, tp_rank_and_size

__all__ = ["padded_vocab_size", "vocab_range", "VocabParallelEmbedding",
           "vocab_parallel_cross_entropy", "vocab_parallel_loss_bytes",
           "gathered_logits_bytes"]

REDUCTIONS = ("mean", "sum", "none")


def padded_vocab_size(vocab_size: int, t: int, *, multiple: int = 1) -> int:
    """Megatron-LM's `_vocab_size_with_padding`: the smallest multiple of multiple·t that is at
    least `vocab_size` (each of the t ranks then holds padded/t rows, a multiple of `multiple`)."""
    if vocab_size < 1 or t < 1 or multiple < 1:
        raise ValueError(f"vocab_size, t and multiple must be positive, got {vocab_size}, {t}, "
                         f"{multiple}")
    step = multiple * t
    return -(-vocab_size // step) * step


def vocab_range(padded: int, rank: int, t: int) -> tuple[int, int]:
    """[start, end): the rows of a padded vocabulary rank `rank` of t holds."""
    if padded % t:
        raise ValueError(f"the padded vocabulary {padded} is not divisible by t = {t}: pad it "
                         "with padded_vocab_size(V, t) first")
    n = padded // t
    return rank * n, (rank + 1) * n


def _outside(ids: Tensor, start: int, end: int) -> tuple[Tensor, Tensor]:
    """(mask of ids not in [start, end), ids shifted to local rows, 0 where masked)."""
    outside = (ids < start) | (ids >= end)
    return outside, (ids - start).masked_fill(outside, 0)


class VocabParallelEmbedding(nn.Module):
    """nn.Embedding split over the vocabulary: weight (V'/t, h), this rank's rows of the padded
    table (the padded rows zero). forward: masked lookup, then g (forward all-reduce,
    backward identity); ids (...) -> (..., h), the same on every rank."""

    def __init__(self, num_embeddings: int, embedding_dim: int, *,
                 group: dist.ProcessGroup | None = None, multiple: int = 1,
                 device: torch.device | str | None = None, dtype: torch.dtype | None = None):
        super().__init__()
        self.rank, self.t = tp_rank_and_size(group)
        self.group = group
        self.num_embeddings, self.embedding_dim = num_embeddings, embedding_dim
        self.padded = padded_vocab_size(num_embeddings, self.t, multiple=multiple)
        self.start, self.end = vocab_range(self.padded, self.rank, self.t)
        self.weight = nn.Parameter(torch.empty(self.end - self.start, embedding_dim,
                                               device=device, dtype=dtype))  # (V'/t, h)
        nn.init.normal_(self.weight)  # nn.Embedding's initialisation, row by row
        with torch.no_grad():
            self.weight[max(0, num_embeddings - self.start):].zero_()  # the padding

    @classmethod
    def from_embedding(cls, embedding: nn.Embedding, *, group: dist.ProcessGroup | None = None,
                       multiple: int = 1) -> VocabParallelEmbedding:
        """This rank's rows of `embedding`'s table (a copy), padded with zero rows."""
        w = embedding.weight
        layer = cls(embedding.num_embeddings, embedding.embedding_dim, group=group,
                    multiple=multiple, device=w.device, dtype=w.dtype)
        real = min(layer.end, embedding.num_embeddings) - layer.start
        with torch.no_grad():
            layer.weight.zero_()
            if real > 0:
                layer.weight[:real].copy_(w[layer.start:layer.start + real])
        return layer

    def forward(self, ids: Tensor) -> Tensor:  # ids: (...) word ids in [0, V)
        outside, local = _outside(ids, self.start, self.end)
        part = F.embedding(local, self.weight).masked_fill(outside.unsqueeze(-1), 0.0)
        return reduce_from_tp_region(part, group=self.group)  # (..., h): the sum of the parts

    def extra_repr(self) -> str:
        return (f"{self.num_embeddings}, {self.embedding_dim} (padded {self.padded}; this rank: "
                f"rows {self.start}..{self.end - 1}), rank={self.rank}, t={self.t}")


def _all_reduce(x: Tensor, op: Any, group: dist.ProcessGroup | None, t: int) -> Tensor:
    if t > 1:
        dist.all_reduce(x, op=op, group=group)  # x is this function's own tensor
    return x


class _VocabParallelCrossEntropy(torch.autograd.Function):
    """forward: per-token loss from the local columns and 3 all-reduces of one number per token,
    the padded columns (past vocab_size) at -inf first (this course's choice; Megatron-LM's
    keeps them); backward: softmax minus one-hot on the local columns, times the incoming
    gradient, no communication."""

    @staticmethod
    def forward(ctx: Any, logits: Tensor, target: Tensor, group: dist.ProcessGroup | None,
                vocab_size: int | None) -> Tensor:
        rank, t = tp_rank_and_size(group)
        n = logits.shape[-1]
        start = rank * n
        x = logits.float() if logits.dtype in (torch.float16, torch.bfloat16) else logits
        if vocab_size is not None and start + n > vocab_size:  # padded columns: never counted
            cols = torch.arange(start, start + n, device=x.device)
            x = x.masked_fill(cols >= vocab_size, float("-inf"))
        m = _all_reduce(x.detach().amax(dim=-1), dist.ReduceOp.MAX, group, t)  # (N,)
        x = x - m.unsqueeze(-1)  # (N, n), at most 0 everywhere: exp cannot overflow
        outside, local = _outside(target, start, start + n)
        picked = x.gather(-1, local.unsqueeze(-1)).squeeze(-1).masked_fill(outside, 0.0)
        picked = _all_reduce(picked, dist.ReduceOp.SUM, group, t)  # x_{i,y_i} - m_i
        e = x.exp()  # (N, n)
        total = _all_reduce(e.sum(dim=-1), dist.ReduceOp.SUM, group, t)  # (N,)
        e.div_(total.unsqueeze(-1))  # the softmax of the local columns
        ctx.save_for_backward(e, local, outside)
        ctx.dtype = logits.dtype
        return total.log() - picked  # (N,)

    @staticmethod
    def backward(ctx: Any, grad: Tensor) -> tuple[Tensor, None, None, None]:
        softmax, local, outside = ctx.saved_tensors
        onehot = F.one_hot(local, softmax.shape[-1]).to(softmax.dtype)
        onehot = onehot.masked_fill(outside.unsqueeze(-1), 0.0)
        return ((softmax - onehot) * grad.unsqueeze(-1)).to(ctx.dtype), None, None, None


def vocab_parallel_cross_entropy(logits_shard: Tensor, target: Tensor,
                                 group: dist.ProcessGroup | None = None, *,
                                 vocab_size: int | None = None,
                                 reduction: str = "mean") -> Tensor:
    """F.cross_entropy(logits, target) from this rank's columns of the logits, never gathered.

    logits_shard: (..., V'/t), columns [r V'/t, (r+1) V'/t) of the logits; target: (...) word
    ids in [0, V), the same on every rank; vocab_size: V, when the last columns are padding
    (excluded, so the loss is F.cross_entropy over the real V; Megatron-LM's function has no
    such argument and counts them). forward: 3 all-reduces of one number per token (max,
    target logit, sum of exponentials); backward: softmax minus one-hot, local. reduction as
    F.cross_entropy's."""
    if reduction not in REDUCTIONS:
        raise ValueError(f"reduction must be one of {REDUCTIONS}, got {reduction!r}")
    if logits_shard.shape[:-1] != target.shape:
        raise ValueError(f"logits_shard {tuple(logits_shard.shape)} and target "
                         f"{tuple(target.shape)} must agree on every dimension but the last")
    flat = logits_shard.reshape(-1, logits_shard.shape[-1])  # (N, V'/t)
    loss = _VocabParallelCrossEntropy.apply(flat, target.reshape(-1), group, vocab_size)
    if reduction == "mean":
        return loss.mean()
    return loss.sum() if reduction == "sum" else loss.reshape(target.shape)


def vocab_parallel_loss_bytes(b: int, s: int, t: int, *, dtype_bytes: int = 4) -> float:
    """Bytes one rank sends for the vocabulary-parallel loss: 3 ring all-reduces of one number
    per token, 3 · 2(t-1)/t · b·s·dtype_bytes."""
    return 3 * 2 * (t - 1) / t * b * s * dtype_bytes


def gathered_logits_bytes(b: int, s: int, vocab: int, t: int) -> float:
    """Bytes one rank sends to all-gather the fp32 logits instead, (t-1)/t · 4·b·s·V (and every
    rank then holds all b·s·V of them: `parlab.costs.logits_bytes`)."""
    return (t - 1) / t * logits_bytes(b, s, vocab)
