r"""A column-parallel GEMM that keeps only its sequence shard and gathers it again in backward.

Under TP + SP the QKV and fc1 GEMMs need the whole $(B, T, C)$ LayerNorm output, so it is
all-gathered first. A plain autograd version, `F.linear(gather(x), W)`, then keeps the gathered
tensor for the weight gradient $\partial L/\partial W = G^\top X$: $4sbh$ bytes a layer, the
same on every rank. Megatron-LM (`LinearWithGradAccumulationAndAsyncCommunication` with
`sequence_parallel`) and Transformer Engine keep only this rank's $(B, T/t, C)$ shard and
all-gather it again in the backward pass, overlapped with the input-gradient GEMM (Korthikanti
et al. 2022, arXiv:2205.05198, section 4.2.2): $4sbh/t$ kept, one more all-gather for each of
the two GEMMs. `gathered_linear` is that function:

    forward:  X = all_gather(x);  Y = X W^T + b;                 saved: x (the shard), W
    backward: X = all_gather(x)   (the re-gather);
              dX = dY W;  dx = reduce_scatter(dX);  dW = dY^T X;  db = sum of dY

so a layer sends 6 all-gathers and 4 reduce-scatters (`parlab.costs.tp_bytes_by_collective`)
and keeps $34\,sbh/t$ (`parlab.costs.activation_bytes_per_layer(..., sp=True)`).
`parlab.tp.SPBlock(..., regather=True)` uses it; module 03 measures both versions.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist
from torch import Tensor

from parlab.tp.mappings import _gather, _reduce_scatter

__all__ = ["gathered_linear"]


class _LinearWithSequenceParallelGather(torch.autograd.Function):
    """All-gather the sequence shard, then a linear layer; saves the shard, not the gather."""

    @staticmethod
    def forward(ctx: Any, x: Tensor, weight: Tensor, bias: Tensor | None,
                group: dist.ProcessGroup | None) -> Tensor:
        ctx.group, ctx.has_bias = group, bias is not None
        ctx.save_for_backward(x, weight)  # x: (B, T/t, C), this rank's tokens only
        return torch.nn.functional.linear(_gather(x, group), weight, bias)  # (B, T, out)

    @staticmethod
    def backward(ctx: Any, grad: Tensor) -> tuple[Tensor, Tensor, Tensor | None, None]:
        x, weight = ctx.saved_tensors
        total = _gather(x, ctx.group)  # (B, T, C): the extra all-gather of the backward pass
        grad_input = _reduce_scatter(grad @ weight, ctx.group)  # (B, T/t, C)
        grad_weight = grad.reshape(-1, grad.shape[-1]).t() @ total.reshape(-1, total.shape[-1])
        grad_bias = grad.reshape(-1, grad.shape[-1]).sum(0) if ctx.has_bias else None
        return grad_input, grad_weight, grad_bias, None


def gathered_linear(x: Tensor, weight: Tensor, bias: Tensor | None = None, *,
                    group: dist.ProcessGroup | None = None) -> Tensor:
    """(B, T/t, C) -> (B, T, out): `F.linear(all_gather(x), weight, bias)` that keeps only `x`
    for backward and all-gathers it again there (module docstring)."""
    return _LinearWithSequenceParallelGather.apply(x, weight, bias, group)
