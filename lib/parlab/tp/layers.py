r"""Megatron's parallel linear layers and the tensor-parallel MLP.

A GEMM $Y = XA$ can be split two ways over the t ranks of a group:

- column-parallel, $A = [A_1 | \dots | A_t]$: rank i computes $Y_i = XA_i$, its slice of the
  output features, from the whole (replicated) X. No communication in forward.
- row-parallel, $A = [A_1; \dots; A_t]$ with X split to match: rank i computes the partial sum
  $X_iA_i$ and $Y = \sum_i X_iA_i$ is one all-reduce.

PyTorch's nn.Linear stores weight $W = A^\top$ as (out_features, in_features), so a column
split of A keeps a block of ROWS of `weight` (dim 0) and a row split keeps a block of its
COLUMNS (dim 1).

The MLP is $Z = g(\mathrm{GeLU}(f(X)A)B)$: A column-parallel, B row-parallel, one all-reduce
forward (g) and one backward (f); f and g are in `parlab.tp.mappings`. Every layer takes
`group=None` (the default group).
"""

from __future__ import annotations

import math

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import Tensor, nn

from parlab.model.transformer import MLP
from parlab.tp.mappings import (
    copy_to_tp_region,
    divisible,
    gather_from_tp_region,
    reduce_from_tp_region,
    scatter_to_tp_region,
    tp_rank_and_size,
)

__all__ = ["ColumnParallelLinear", "RowParallelLinear", "TPMLP"]


def _init_like_linear(weight: Tensor, bias: Tensor | None, fan_in: int) -> None:
    """nn.Linear's default initialisation, with the fan-in of the whole (unsplit) layer."""
    bound = 1 / math.sqrt(fan_in)
    nn.init.uniform_(weight, -bound, bound)
    if bias is not None:
        nn.init.uniform_(bias, -bound, bound)


class ColumnParallelLinear(nn.Module):
    """$Y_i = f(X) A_i + b_i$: this rank's out_features/t output features.

    weight: (out_features/t, in_features), rows rank*n:(rank+1)*n of the full layer's weight;
    bias: (out_features/t,). Input replicated; output sharded on the last dim unless
    gather_output=True (then all-gathered back to (..., out_features)).
    """

    def __init__(self, in_features: int, out_features: int, *, bias: bool = True,
                 gather_output: bool = False, group: dist.ProcessGroup | None = None,
                 device: torch.device | str | None = None, dtype: torch.dtype | None = None):
        super().__init__()
        self.rank, self.t = tp_rank_and_size(group)
        self.group, self.gather_output = group, gather_output
        self.in_features, self.out_features = in_features, out_features
        n = divisible(out_features, self.t, "out_features",
                      "pick a layer width (or a t) so that t divides it")
        self.weight = nn.Parameter(torch.empty(n, in_features, device=device, dtype=dtype))
        self.bias = (nn.Parameter(torch.empty(n, device=device, dtype=dtype)) if bias
                     else None)  # weight (out/t, in), bias (out/t,)
        _init_like_linear(self.weight, self.bias, in_features)

    @classmethod
    def from_linear(cls, linear: nn.Linear, *, group: dist.ProcessGroup | None = None,
                    gather_output: bool = False) -> ColumnParallelLinear:
        """This rank's shard of `linear`: a block of rows of its weight (and of its bias)."""
        w = linear.weight
        layer = cls(linear.in_features, linear.out_features, bias=linear.bias is not None,
                    gather_output=gather_output, group=group, device=w.device, dtype=w.dtype)
        rows = slice(layer.rank * layer.weight.shape[0], (layer.rank + 1) * layer.weight.shape[0])
        with torch.no_grad():
            layer.weight.copy_(w[rows])
            if layer.bias is not None:
                layer.bias.copy_(linear.bias[rows])
        return layer

    def forward(self, x: Tensor) -> Tensor:  # x: (..., in), the same on every rank
        y = F.linear(copy_to_tp_region(x, group=self.group), self.weight, self.bias)
        if self.gather_output:  # (..., out/t) -> (..., out)
            return gather_from_tp_region(y, group=self.group)
        return y  # (..., out/t)

    def extra_repr(self) -> str:
        return (f"in_features={self.in_features}, out_features={self.out_features} "
                f"(this rank: {self.weight.shape[0]}), rank={self.rank}, t={self.t}")


class RowParallelLinear(nn.Module):
    """$Y = g(X_i A_i) + b$: partial products summed by one all-reduce, bias added once.

    weight: (out_features, in_features/t), columns rank*n:(rank+1)*n of the full weight;
    bias: (out_features,), replicated, added AFTER the all-reduce (adding it before would
    count it t times). Input sharded on the last dim (input_is_parallel=True, the output of a
    ColumnParallelLinear), or replicated and split here (input_is_parallel=False).
    """

    def __init__(self, in_features: int, out_features: int, *, bias: bool = True,
                 input_is_parallel: bool = True, group: dist.ProcessGroup | None = None,
                 device: torch.device | str | None = None, dtype: torch.dtype | None = None):
        super().__init__()
        self.rank, self.t = tp_rank_and_size(group)
        self.group, self.input_is_parallel = group, input_is_parallel
        self.in_features, self.out_features = in_features, out_features
        n = divisible(in_features, self.t, "in_features",
                      "pick a layer width (or a t) so that t divides it")
        self.weight = nn.Parameter(torch.empty(out_features, n, device=device, dtype=dtype))
        self.bias = (nn.Parameter(torch.empty(out_features, device=device, dtype=dtype)) if bias
                     else None)  # weight (out, in/t), bias (out,)
        _init_like_linear(self.weight, self.bias, in_features)

    @classmethod
    def from_linear(cls, linear: nn.Linear, *, group: dist.ProcessGroup | None = None,
                    input_is_parallel: bool = True) -> RowParallelLinear:
        """This rank's shard of `linear`: a block of columns of its weight, the whole bias."""
        w = linear.weight
        layer = cls(linear.in_features, linear.out_features, bias=linear.bias is not None,
                    input_is_parallel=input_is_parallel, group=group, device=w.device,
                    dtype=w.dtype)
        n = layer.weight.shape[1]
        with torch.no_grad():
            layer.weight.copy_(w[:, layer.rank * n:(layer.rank + 1) * n])
            if layer.bias is not None:
                layer.bias.copy_(linear.bias)
        return layer

    def forward(self, x: Tensor) -> Tensor:  # x: (..., in/t), or (..., in) replicated
        if not self.input_is_parallel:
            x = scatter_to_tp_region(x, group=self.group)  # (..., in/t)
        partial = F.linear(x, self.weight)  # (..., out): this rank's term of the sum
        y = reduce_from_tp_region(partial, group=self.group)  # (..., out), replicated
        return y if self.bias is None else y + self.bias

    def extra_repr(self) -> str:
        return (f"in_features={self.in_features} (this rank: {self.weight.shape[1]}), "
                f"out_features={self.out_features}, rank={self.rank}, t={self.t}")


class TPMLP(nn.Module):
    r"""$Z = g(\mathrm{GeLU}(f(X)A_i)B_i) + b$: fc1 column-parallel, fc2 row-parallel.

    GeLU is elementwise, so it acts on each rank's slice of the ffn features on its own:
    one all-reduce forward (in fc2) and one backward (in fc1's f).
    """

    def __init__(self, fc1: ColumnParallelLinear, fc2: RowParallelLinear):
        super().__init__()
        self.fc1, self.fc2 = fc1, fc2

    @classmethod
    def from_mlp(cls, mlp: MLP, *, group: dist.ProcessGroup | None = None) -> TPMLP:
        """This rank's shard of a single-device MLP (any module with Linear fc1 and fc2)."""
        return cls(ColumnParallelLinear.from_linear(mlp.fc1, group=group),
                   RowParallelLinear.from_linear(mlp.fc2, group=group))

    def forward(self, x: Tensor) -> Tensor:  # (B, T, C), replicated
        h = F.gelu(self.fc1(x))  # (B, T, ffn/t): this rank's slice, no communication
        return self.fc2(h)  # (B, T, C): all-reduced, replicated
