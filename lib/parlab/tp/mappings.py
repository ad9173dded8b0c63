r"""Megatron's communication operators for tensor and sequence parallelism (its `mappings.py`).

Each operator is an autograd function named for the way data moves; the pairs are conjugate
(what one does in forward, the other does in backward):

| operator                                     | paper  | forward        | backward       |
|----------------------------------------------|--------|----------------|----------------|
| `copy_to_tp_region`                          | f      | identity       | all-reduce     |
| `reduce_from_tp_region`                      | g      | all-reduce     | identity       |
| `gather_from_tp_region`                      |        | all-gather     | split          |
| `scatter_to_tp_region`                       |        | split          | all-gather     |
| `gather_from_sequence_parallel_region`       | f (SP) | all-gather     | reduce-scatter |
| `reduce_scatter_to_sequence_parallel_region` | g (SP) | reduce-scatter | all-gather     |
| `scatter_to_sequence_parallel_region`        |        | own rows       | all-gather     |

The TP operators act on the last (feature) dimension, the SP operators on the sequence
dimension of (B, T, C) activations (`SEQ_DIM` = 1; Megatron's (T, B, C) layout uses dim 0).
A ring all-reduce IS a reduce-scatter then an all-gather, so trading f and g for the SP pair
moves the same bytes (`parlab.tp.sequence.sp_bytes_per_layer`), as long as the GEMMs keep the
gathered input; keeping only the shard costs an all-gather more in backward
(`parlab.tp.regather`).

Every function takes `group=None` (the default group); with torch.distributed not initialised
every operator is the identity (t = 1). Collectives are called as `dist.all_reduce(...)`,
`dist.all_gather(...)`, `dist.reduce_scatter(...)`, so `parlab.comm.trace()` sees them.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist
from torch import Tensor

__all__ = [
    "tp_rank_and_size", "divisible", "copy_to_tp_region", "reduce_from_tp_region",
    "gather_from_tp_region", "scatter_to_tp_region", "SEQ_DIM",
    "gather_from_sequence_parallel_region", "reduce_scatter_to_sequence_parallel_region",
    "scatter_to_sequence_parallel_region",
]


def tp_rank_and_size(group: dist.ProcessGroup | None = None) -> tuple[int, int]:
    """(this rank's index in `group`, the group's size t); (0, 1) without torch.distributed."""
    if not dist.is_available() or not dist.is_initialized():
        return 0, 1
    return dist.get_rank(group), dist.get_world_size(group)


def divisible(n: int, t: int, what: str, fix: str) -> int:
    """n // t, or a ValueError that says what to change."""
    if n % t:
        raise ValueError(f"{what} = {n} is not divisible by the tensor-parallel size t = {t}; "
                         f"{fix}")
    return n // t


def _all_reduce(x: Tensor, group: dist.ProcessGroup | None) -> Tensor:
    out = x.clone(memory_format=torch.contiguous_format)  # never overwrite the caller's tensor
    if tp_rank_and_size(group)[1] > 1:
        dist.all_reduce(out, group=group)
    return out


def _all_gather_last(x: Tensor, group: dist.ProcessGroup | None) -> Tensor:
    _, t = tp_rank_and_size(group)
    if t == 1:
        return x
    parts = [torch.empty_like(x, memory_format=torch.contiguous_format) for _ in range(t)]
    dist.all_gather(parts, x.contiguous(), group=group)
    return torch.cat(parts, dim=-1)  # (..., t * n)


def _own_chunk_last(x: Tensor, group: dist.ProcessGroup | None) -> Tensor:
    rank, t = tp_rank_and_size(group)
    n = divisible(x.shape[-1], t, "the last dimension", "pick sizes that t divides")
    return x[..., rank * n:(rank + 1) * n].contiguous()  # (..., n / t)


class _CopyToTPRegion(torch.autograd.Function):
    """f: forward identity, backward all-reduce.

    Used where a replicated tensor enters a column-parallel GEMM: each rank's shard adds its
    own term to dL/dX, so the true gradient is their sum."""

    @staticmethod
    def forward(ctx: Any, x: Tensor, group: dist.ProcessGroup | None) -> Tensor:
        ctx.group = group
        return x

    @staticmethod
    def backward(ctx: Any, grad: Tensor) -> tuple[Tensor, None]:
        return _all_reduce(grad, ctx.group), None


class _ReduceFromTPRegion(torch.autograd.Function):
    """g: forward all-reduce, backward identity.

    Sums the partial outputs of a row-parallel GEMM; the output is replicated, so every rank
    already holds the whole upstream gradient and passes it through unchanged."""

    @staticmethod
    def forward(ctx: Any, x: Tensor, group: dist.ProcessGroup | None) -> Tensor:
        return _all_reduce(x, group)

    @staticmethod
    def backward(ctx: Any, grad: Tensor) -> tuple[Tensor, None]:
        return grad, None


class _GatherFromTPRegion(torch.autograd.Function):
    """forward: all-gather along the last dim; backward: keep this rank's slice."""

    @staticmethod
    def forward(ctx: Any, x: Tensor, group: dist.ProcessGroup | None) -> Tensor:
        ctx.group = group
        return _all_gather_last(x, group)

    @staticmethod
    def backward(ctx: Any, grad: Tensor) -> tuple[Tensor, None]:
        return _own_chunk_last(grad, ctx.group), None


class _ScatterToTPRegion(torch.autograd.Function):
    """forward: keep this rank's slice of the last dim; backward: all-gather."""

    @staticmethod
    def forward(ctx: Any, x: Tensor, group: dist.ProcessGroup | None) -> Tensor:
        ctx.group = group
        return _own_chunk_last(x, group)

    @staticmethod
    def backward(ctx: Any, grad: Tensor) -> tuple[Tensor, None]:
        return _all_gather_last(grad, ctx.group), None


def copy_to_tp_region(x: Tensor, *, group: dist.ProcessGroup | None = None) -> Tensor:
    """f — forward: identity; backward: all-reduce the gradient over `group`."""
    return _CopyToTPRegion.apply(x, group)


def reduce_from_tp_region(x: Tensor, *, group: dist.ProcessGroup | None = None) -> Tensor:
    """g — forward: all-reduce (sum) over `group`; backward: identity."""
    return _ReduceFromTPRegion.apply(x, group)


def gather_from_tp_region(x: Tensor, *, group: dist.ProcessGroup | None = None) -> Tensor:
    """forward: all-gather the last dim, (..., n) -> (..., t*n); backward: own slice."""
    return _GatherFromTPRegion.apply(x, group)


def scatter_to_tp_region(x: Tensor, *, group: dist.ProcessGroup | None = None) -> Tensor:
    """forward: own slice of the last dim, (..., n) -> (..., n/t); backward: all-gather."""
    return _ScatterToTPRegion.apply(x, group)


SEQ_DIM = 1  # activations are (B, T, C)


def _rows(n: int, t: int) -> int:
    return divisible(n, t, "the sequence length", "pick a sequence length that t divides")


def _gather(x: Tensor, group: dist.ProcessGroup | None) -> Tensor:
    """(B, T/t, C) -> (B, T, C): the ranks' shards side by side along the sequence."""
    _, t = tp_rank_and_size(group)
    if t == 1:
        return x
    x = x.contiguous()
    parts = [torch.empty_like(x) for _ in range(t)]
    dist.all_gather(parts, x, group=group)
    return torch.cat(parts, dim=SEQ_DIM)


def _reduce_scatter(x: Tensor, group: dist.ProcessGroup | None) -> Tensor:
    """(B, T, C) -> (B, T/t, C): the sum over ranks of this rank's rows."""
    _, t = tp_rank_and_size(group)
    if t == 1:
        return x
    n = _rows(x.shape[SEQ_DIM], t)
    parts = [p.contiguous() for p in x.split(n, dim=SEQ_DIM)]  # t x (B, T/t, C)
    out = torch.empty_like(parts[0])
    dist.reduce_scatter(out, parts, group=group)
    return out


def _split(x: Tensor, group: dist.ProcessGroup | None) -> Tensor:
    """(B, T, C) -> (B, T/t, C): this rank's rows, no communication."""
    rank, t = tp_rank_and_size(group)
    n = _rows(x.shape[SEQ_DIM], t)
    return x.narrow(SEQ_DIM, rank * n, n).contiguous()


class _GatherFromSequenceParallelRegion(torch.autograd.Function):
    """forward: all-gather along the sequence; backward: reduce-scatter (or own rows).

    Entering a tensor-parallel region: every rank's column shard uses all T tokens, so the
    gradient of the gathered tensor is partial on each rank and rank i needs the sum of its
    rows: a reduce-scatter. With tensor_parallel_output_grad=False (the gathered tensor is used
    the same way on every rank, e.g. a replicated loss) the gradient is already whole and rank i
    keeps its rows."""

    @staticmethod
    def forward(ctx: Any, x: Tensor, group: dist.ProcessGroup | None,
                tensor_parallel_output_grad: bool) -> Tensor:
        ctx.group, ctx.reduce = group, tensor_parallel_output_grad
        return _gather(x, group)

    @staticmethod
    def backward(ctx: Any, grad: Tensor) -> tuple[Tensor, None, None]:
        return (_reduce_scatter(grad, ctx.group) if ctx.reduce else _split(grad, ctx.group),
                None, None)


class _ReduceScatterToSequenceParallelRegion(torch.autograd.Function):
    """forward: reduce-scatter along the sequence; backward: all-gather.

    Leaving a tensor-parallel region: the row-parallel GEMM's partial sums are added and each
    rank keeps its rows; the gradient of rank i's rows lives on rank i only, and every rank's
    partial sum needs the gradient of all T tokens: an all-gather."""

    @staticmethod
    def forward(ctx: Any, x: Tensor, group: dist.ProcessGroup | None) -> Tensor:
        ctx.group = group
        return _reduce_scatter(x, group)

    @staticmethod
    def backward(ctx: Any, grad: Tensor) -> tuple[Tensor, None]:
        return _gather(grad, ctx.group), None


class _ScatterToSequenceParallelRegion(torch.autograd.Function):
    """forward: keep this rank's rows of a replicated tensor; backward: all-gather."""

    @staticmethod
    def forward(ctx: Any, x: Tensor, group: dist.ProcessGroup | None) -> Tensor:
        ctx.group = group
        return _split(x, group)

    @staticmethod
    def backward(ctx: Any, grad: Tensor) -> tuple[Tensor, None]:
        return _gather(grad, ctx.group), None


def gather_from_sequence_parallel_region(x: Tensor, *, group: dist.ProcessGroup | None = None,
                                         tensor_parallel_output_grad: bool = True) -> Tensor:
    """forward: all-gather, (B, T/t, C) -> (B, T, C); backward: reduce-scatter (own rows when
    tensor_parallel_output_grad=False)."""
    return _GatherFromSequenceParallelRegion.apply(x, group, tensor_parallel_output_grad)


def reduce_scatter_to_sequence_parallel_region(x: Tensor, *,
                                               group: dist.ProcessGroup | None = None) -> Tensor:
    """forward: reduce-scatter, (B, T, C) -> (B, T/t, C); backward: all-gather."""
    return _ReduceScatterToSequenceParallelRegion.apply(x, group)


def scatter_to_sequence_parallel_region(x: Tensor, *,
                                        group: dist.ProcessGroup | None = None) -> Tensor:
    """forward: own rows, (B, T, C) -> (B, T/t, C); backward: all-gather."""
    return _ScatterToSequenceParallelRegion.apply(x, group)
