r"""A reference FSDP-style linear layer, and the per-layer reshard planner of module 01.

Sharding. A layer's parameters are flattened into one vector of P elements,
$\theta = [\mathrm{vec}(W); b]$, padded with zeros to a multiple of t, and rank r keeps
elements $[r n, (r+1) n)$ with $n = \lceil P/t \rceil$: the optimizer only ever sees its shard.

One training step of `FSDPLinear` (reshard_after_forward=True, the default):

| when      | collective                          | per-rank bytes sent (ring)       |
|-----------|-------------------------------------|----------------------------------|
| forward   | all-gather $\theta$ from the shards | $\frac{t-1}{t}Pd$                |
| backward  | all-gather $\theta$ again (refetch) | $\frac{t-1}{t}Pd$                |
| backward  | reduce-scatter $\nabla\theta$, /t   | $\frac{t-1}{t}Pd$                |

$3\frac{t-1}{t}Pd$ in all (d bytes per element), `parlab.costs.dp_traffic_bytes(P, "fsdp", t,
dtype_bytes=d)`; with reshard_after_forward=False the gathered $\theta$ is saved for backward
and the refetch goes: $2\frac{t-1}{t}Pd$, DDP's bytes, at the price of holding $\theta$ whole
from forward to backward. Dividing the reduce-scatter by t makes every rank's shard of the
gradient the mean over ranks, as DDP's averaged all-reduce does, so a step equals DDP's.

Communication is apart from the algorithm: `gather_flat_params` / `reduce_scatter_flat_grads`
are the two collectives (Megatron-style names, docstrings say forward and backward), and
`plan_reshard` is plain arithmetic.
"""

from __future__ import annotations

import itertools
import math

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import Tensor, nn

__all__ = ["shard_bounds", "take_shard", "gather_flat_params", "reduce_scatter_flat_grads",
           "FSDPLinear", "reshard_bytes", "plan_reshard"]


def _world(group: dist.ProcessGroup | None) -> tuple[int, int]:
    return dist.get_rank(group), dist.get_world_size(group)


def shard_bounds(numel: int, rank: int, t: int) -> tuple[int, int]:
    r"""[start, end) of rank's shard of a flat vector of `numel` padded to a multiple of t:
    $n = \lceil numel/t \rceil$, start $= r n$."""
    n = math.ceil(numel / t)
    return rank * n, (rank + 1) * n


def take_shard(flat: Tensor, rank: int, t: int) -> Tensor:
    """Rank's shard of the flat parameter (P,) -> (ceil(P/t),), zero-padded, a copy."""
    start, end = shard_bounds(flat.numel(), rank, t)
    padded = F.pad(flat.detach(), (0, end - flat.numel())) if end > flat.numel() else flat
    return padded[start:end].clone()


def gather_flat_params(shard: Tensor, *, numel: int, group: dist.ProcessGroup | None = None
                       ) -> Tensor:
    """forward: all-gather the shards into the flat parameter (n,) -> (numel,);
    backward: (used inside FSDPLinear's Function) reduce-scatter. No autograd here."""
    _, t = _world(group)
    parts = [torch.empty_like(shard) for _ in range(t)]
    dist.all_gather(parts, shard.contiguous(), group=group)
    return torch.cat(parts)[:numel]  # (t*n,) -> drop the padding


def reduce_scatter_flat_grads(grad: Tensor, *, group: dist.ProcessGroup | None = None
                              ) -> Tensor:
    r"""backward: reduce-scatter the flat gradient (P,) -> this rank's (n,), averaged:
    $\frac{1}{t}\sum_q g_q[rn:(r+1)n]$ (forward: the all-gather of gather_flat_params)."""
    _, t = _world(group)
    n = math.ceil(grad.numel() / t)
    padded = F.pad(grad, (0, t * n - grad.numel()))  # (t*n,): zeros at the end, if any
    parts = [p.contiguous() for p in padded.chunk(t)]
    out = torch.empty_like(parts[0])
    dist.reduce_scatter(out, parts, group=group)
    return out / t


class _FSDPLinearFn(torch.autograd.Function):
    """y = x W^T + b with theta = [vec W; b] gathered from shards; see the module docstring."""

    @staticmethod
    def forward(ctx, x: Tensor, shard: Tensor, out_f: int, in_f: int, reshard: bool,
                group: dist.ProcessGroup | None) -> Tensor:
        flat = gather_flat_params(shard, numel=out_f * in_f + out_f, group=group)  # (P,)
        weight, bias = flat[:out_f * in_f].view(out_f, in_f), flat[out_f * in_f:]
        ctx.dims, ctx.group, ctx.numel = (out_f, in_f), group, flat.numel()
        ctx.save_for_backward(x, shard if reshard else flat)  # resharded: only the shard kept
        ctx.reshard = reshard
        return F.linear(x, weight, bias)  # (..., in) -> (..., out)

    @staticmethod
    def backward(ctx, grad_y: Tensor) -> tuple:
        x, kept = ctx.saved_tensors
        out_f, in_f = ctx.dims
        flat = gather_flat_params(kept, numel=ctx.numel, group=ctx.group) if ctx.reshard \
            else kept  # refetch, or the copy kept since forward
        weight = flat[:out_f * in_f].view(out_f, in_f)
        g2, x2 = grad_y.reshape(-1, out_f), x.reshape(-1, in_f)  # (N, out), (N, in)
        grad_flat = torch.cat([(g2.T @ x2).flatten(), g2.sum(0)])  # (P,): [vec dW; db]
        grad_shard = reduce_scatter_flat_grads(grad_flat, group=ctx.group)
        return grad_y @ weight, grad_shard, None, None, None, None


class FSDPLinear(nn.Module):
    """A linear layer whose rank keeps only its shard of [vec W; b] (see the module docstring).

        layer = FSDPLinear.from_linear(nn.Linear(8, 8), reshard_after_forward=True)
        layer.shard          # nn.Parameter (ceil(72 / t),): all the optimizer sees
    """

    def __init__(self, in_features: int, out_features: int, *, reshard_after_forward: bool = True,
                 group: dist.ProcessGroup | None = None) -> None:
        super().__init__()
        rank, t = _world(group)
        self.in_features, self.out_features = in_features, out_features
        self.reshard_after_forward, self.group = reshard_after_forward, group
        n = math.ceil((out_features * in_features + out_features) / t)
        self.shard = nn.Parameter(torch.zeros(n))

    @classmethod
    def from_linear(cls, linear: nn.Linear, *, reshard_after_forward: bool = True,
                    group: dist.ProcessGroup | None = None) -> FSDPLinear:
        layer = cls(linear.in_features, linear.out_features,
                    reshard_after_forward=reshard_after_forward, group=group)
        rank, t = _world(group)
        flat = torch.cat([linear.weight.detach().flatten(), linear.bias.detach()])
        with torch.no_grad():
            layer.shard.copy_(take_shard(flat, rank, t))
        return layer

    def forward(self, x: Tensor) -> Tensor:
        return _FSDPLinearFn.apply(x, self.shard, self.out_features, self.in_features,
                                   self.reshard_after_forward, self.group)


# --- the reshard choice, per layer ----------------------------------------------------------

def reshard_bytes(sizes: list[float], reshard: list[bool], t: int) -> dict[str, float]:
    r"""Peak resident memory and per-rank bytes sent for a choice of reshard_after_forward.

    Layer i gathers $s_i$ bytes; kept (reshard False) it stays resident from its forward to its
    backward and moves $2\frac{t-1}{t}s_i$, resharded it moves $3\frac{t-1}{t}s_i$.
    Peak = $\sum_{i\,\text{kept}} s_i$: at the turn from forward to backward all kept layers
    are resident at once (the one transient gathered layer is not counted here).
    """
    kept = sum(s for s, r in zip(sizes, reshard, strict=True) if not r)
    moved = sum((3 if r else 2) * (t - 1) / t * s for s, r in zip(sizes, reshard, strict=True))
    return {"peak": kept, "moved": moved}


def plan_reshard(sizes: list[float], budget: float) -> list[bool]:
    r"""reshard_after_forward per layer that moves the fewest bytes with peak <= budget.

    Bytes moved fall by $\frac{t-1}{t}s_i$ for every kept layer, so the best plan keeps the
    subset of largest total $\sum s_i \le$ budget (subset sum; exact search, for n <= 20 layers).
    Ties go to the plan that keeps the earliest layers.
    """
    n = len(sizes)
    if n > 20:
        raise ValueError(f"plan_reshard searches all subsets; got {n} layers (at most 20)")
    best: tuple[float, tuple[int, ...]] = (0.0, ())
    for k in range(n, 0, -1):
        for keep in itertools.combinations(range(n), k):
            total = sum(sizes[i] for i in keep)
            if total <= budget and total > best[0]:
                best = (total, keep)
    return [i not in best[1] for i in range(n)]
