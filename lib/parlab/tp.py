r"""Megatron tensor parallelism: the f/g operators, column- and row-parallel linear layers, the MLP.

A GEMM $Y = XA$ can be split two ways over the t ranks of a group:

- column-parallel, $A = [A_1 | \dots | A_t]$: rank i computes $Y_i = XA_i$, its slice of the
  output features, from the whole (replicated) X. No communication in forward.
- row-parallel, $A = [A_1; \dots; A_t]$ with X split to match: rank i computes the partial sum
  $X_iA_i$ and $Y = \sum_i X_iA_i$ is one all-reduce.

PyTorch's nn.Linear stores weight $W = A^\top$ as (out_features, in_features), so a column
split of A keeps a block of ROWS of `weight` (dim 0) and a row split keeps a block of its
COLUMNS (dim 1).

The two communication operators are conjugate autograd functions (Megatron's f and g):

| operator                  | paper | forward    | backward   |
|---------------------------|-------|------------|------------|
| `copy_to_tp_region`       | f     | identity   | all-reduce |
| `reduce_from_tp_region`   | g     | all-reduce | identity   |
| `gather_from_tp_region`   |       | all-gather | split      |
| `scatter_to_tp_region`    |       | split      | all-gather |

The MLP is $Z = g(\mathrm{GeLU}(f(X)A)B)$: A column-parallel, B row-parallel, one all-reduce
forward (g) and one backward (f). Every function takes `group=None` (the default group); with
torch.distributed not initialised every operator is the identity (t = 1).

Collectives are called as `dist.all_reduce(...)`, so `parlab.comm.trace()` sees them.
"""

from __future__ import annotations

import math
from typing import Any

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import Tensor, nn

__all__ = [
    "tp_rank_and_size", "divisible", "copy_to_tp_region", "reduce_from_tp_region",
    "gather_from_tp_region", "scatter_to_tp_region", "ColumnParallelLinear", "RowParallelLinear",
    "MLP", "TPMLP",
]


def tp_rank_and_size(group: Any = None) -> tuple[int, int]:
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


def _all_reduce(x: Tensor, group: Any) -> Tensor:
    out = x.clone(memory_format=torch.contiguous_format)  # never overwrite the caller's tensor
    if tp_rank_and_size(group)[1] > 1:
        dist.all_reduce(out, group=group)
    return out


def _all_gather_last(x: Tensor, group: Any) -> Tensor:
    _, t = tp_rank_and_size(group)
    if t == 1:
        return x
    parts = [torch.empty_like(x, memory_format=torch.contiguous_format) for _ in range(t)]
    dist.all_gather(parts, x.contiguous(), group=group)
    return torch.cat(parts, dim=-1)  # (..., t * n)


def _own_chunk_last(x: Tensor, group: Any) -> Tensor:
    rank, t = tp_rank_and_size(group)
    n = divisible(x.shape[-1], t, "the last dimension", "pick sizes that t divides")
    return x[..., rank * n:(rank + 1) * n].contiguous()  # (..., n / t)


class _CopyToTPRegion(torch.autograd.Function):
    """f: forward identity, backward all-reduce.

    Used where a replicated tensor enters a column-parallel GEMM: each rank's shard adds its
    own term to dL/dX, so the true gradient is their sum."""

    @staticmethod
    def forward(ctx: Any, x: Tensor, group: Any) -> Tensor:
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
    def forward(ctx: Any, x: Tensor, group: Any) -> Tensor:
        return _all_reduce(x, group)

    @staticmethod
    def backward(ctx: Any, grad: Tensor) -> tuple[Tensor, None]:
        return grad, None


class _GatherFromTPRegion(torch.autograd.Function):
    """forward: all-gather along the last dim; backward: keep this rank's slice."""

    @staticmethod
    def forward(ctx: Any, x: Tensor, group: Any) -> Tensor:
        ctx.group = group
        return _all_gather_last(x, group)

    @staticmethod
    def backward(ctx: Any, grad: Tensor) -> tuple[Tensor, None]:
        return _own_chunk_last(grad, ctx.group), None


class _ScatterToTPRegion(torch.autograd.Function):
    """forward: keep this rank's slice of the last dim; backward: all-gather."""

    @staticmethod
    def forward(ctx: Any, x: Tensor, group: Any) -> Tensor:
        ctx.group = group
        return _own_chunk_last(x, group)

    @staticmethod
    def backward(ctx: Any, grad: Tensor) -> tuple[Tensor, None]:
        return _all_gather_last(grad, ctx.group), None


def copy_to_tp_region(x: Tensor, *, group: Any = None) -> Tensor:
    """f — forward: identity; backward: all-reduce the gradient over `group`."""
    return _CopyToTPRegion.apply(x, group)


def reduce_from_tp_region(x: Tensor, *, group: Any = None) -> Tensor:
    """g — forward: all-reduce (sum) over `group`; backward: identity."""
    return _ReduceFromTPRegion.apply(x, group)


def gather_from_tp_region(x: Tensor, *, group: Any = None) -> Tensor:
    """forward: all-gather the last dim, (..., n) -> (..., t*n); backward: own slice."""
    return _GatherFromTPRegion.apply(x, group)


def scatter_to_tp_region(x: Tensor, *, group: Any = None) -> Tensor:
    """forward: own slice of the last dim, (..., n) -> (..., n/t); backward: all-gather."""
    return _ScatterToTPRegion.apply(x, group)


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
                 gather_output: bool = False, group: Any = None,
                 device: torch.device | str | None = None, dtype: torch.dtype | None = None):
        super().__init__()
        self.rank, self.t = tp_rank_and_size(group)
        self.group, self.gather_output = group, gather_output
        self.in_features, self.out_features = in_features, out_features
        n = divisible(out_features, self.t, "out_features",
                      "pick a layer width (or a t) so that t divides it")
        kw = {"device": device, "dtype": dtype}
        self.weight = nn.Parameter(torch.empty(n, in_features, **kw))  # (out/t, in)
        self.bias = nn.Parameter(torch.empty(n, **kw)) if bias else None  # (out/t,)
        _init_like_linear(self.weight, self.bias, in_features)

    @classmethod
    def from_linear(cls, linear: nn.Linear, *, group: Any = None,
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
                 input_is_parallel: bool = True, group: Any = None,
                 device: torch.device | str | None = None, dtype: torch.dtype | None = None):
        super().__init__()
        self.rank, self.t = tp_rank_and_size(group)
        self.group, self.input_is_parallel = group, input_is_parallel
        self.in_features, self.out_features = in_features, out_features
        n = divisible(in_features, self.t, "in_features",
                      "pick a layer width (or a t) so that t divides it")
        kw = {"device": device, "dtype": dtype}
        self.weight = nn.Parameter(torch.empty(out_features, n, **kw))  # (out, in/t)
        self.bias = nn.Parameter(torch.empty(out_features, **kw)) if bias else None  # (out,)
        _init_like_linear(self.weight, self.bias, in_features)

    @classmethod
    def from_linear(cls, linear: nn.Linear, *, group: Any = None,
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


class MLP(nn.Module):
    """Single-device reference: fc2(GeLU(fc1(x))), hidden -> ffn (default 4*hidden) -> hidden."""

    def __init__(self, hidden: int, *, ffn: int | None = None, bias: bool = True):
        super().__init__()
        self.fc1 = nn.Linear(hidden, ffn or 4 * hidden, bias=bias)  # weight (4h, h)
        self.fc2 = nn.Linear(ffn or 4 * hidden, hidden, bias=bias)  # weight (h, 4h)

    def forward(self, x: Tensor) -> Tensor:  # (B, T, C) -> (B, T, C)
        return self.fc2(F.gelu(self.fc1(x)))


class TPMLP(nn.Module):
    r"""$Z = g(\mathrm{GeLU}(f(X)A_i)B_i) + b$: fc1 column-parallel, fc2 row-parallel.

    GeLU is elementwise, so it acts on each rank's slice of the ffn features on its own:
    one all-reduce forward (in fc2) and one backward (in fc1's f).
    """

    def __init__(self, fc1: ColumnParallelLinear, fc2: RowParallelLinear):
        super().__init__()
        self.fc1, self.fc2 = fc1, fc2

    @classmethod
    def from_mlp(cls, mlp: MLP, *, group: Any = None) -> TPMLP:
        """This rank's shard of a single-device MLP (any module with Linear fc1 and fc2)."""
        return cls(ColumnParallelLinear.from_linear(mlp.fc1, group=group),
                   RowParallelLinear.from_linear(mlp.fc2, group=group))

    def forward(self, x: Tensor) -> Tensor:  # (B, T, C), replicated
        h = F.gelu(self.fc1(x))  # (B, T, ffn/t): this rank's slice, no communication
        return self.fc2(h)  # (B, T, C): all-reduced, replicated
