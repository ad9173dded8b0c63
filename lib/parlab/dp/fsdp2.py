r"""PyTorch's FSDP2 (`torch.distributed.fsdp.fully_shard`) beside the course's flat-parameter
FSDP (`parlab.dp.fsdp`): which elements each rank holds, what one step moves, and a reference
that shards a stack of layers as torchtitan does (each layer, then the root).

Layout. The course's layer flattens $\theta = [\mathrm{vec}(W); b]$ and gives rank r the
elements $[rn, (r+1)n)$, $n = \lceil P/t \rceil$: a shard may end in the middle of a row of W
and hold part of b. FSDP2 shards every parameter on its own along dim 0 (a DTensor with
placement Shard(0) on the data-parallel mesh), as `torch.chunk` splits it: with R rows,
$c = \lceil R/t \rceil$, rank r holds rows $[rc, \min((r+1)c, R))$, so the last ranks may hold
fewer rows, or none. Each rank's storage is padded to c rows, and one all-gather per
fully_shard unit carries the padded shards of all its parameters, packed:

$$N_\text{unit} = t \sum_{p \in \text{unit}} \lceil R_p/t \rceil \cdot \frac{|p|}{R_p}
\quad (\ge P_\text{unit}; = P_\text{unit} \text{ when } t \text{ divides every } R_p).$$

Bytes per step and rank, ring algorithms, e bytes per element (parlab.costs' ring formulas):
forward all-gather $\frac{t-1}{t} e N$; with reshard_after_forward=True the backward
all-gathers again, $\frac{t-1}{t} e N$; the gradients are reduce-scattered (ReduceOp.AVG in
fp32 and bf16: the mean over the mesh), $\frac{t-1}{t} e N$. So $(3 \text{ or } 2)
\frac{t-1}{t} e N$ per unit: the course's $3\frac{t-1}{t}\cdot eP$ with P padded per
parameter instead of per flat vector. Memory follows the padding too: a gathered parameter is
a view of the all-gather's output, so a layer kept resident (reshard_after_forward=False)
holds $eN_\text{unit}$ bytes from its forward to its backward (measured:
tests/test_fsdp2.py).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import torch
from torch import nn

__all__ = ["dim0_rows", "gathered_numel", "step_bytes", "owners_flat", "owners_dim0",
           "shard_stack"]


def dim0_rows(rows: int, t: int) -> list[tuple[int, int]]:
    r"""[start, end) of the rows of a parameter with `rows` rows that each of t ranks holds
    under FSDP2 (torch.chunk's split: $\lceil R/t \rceil$ rows each, the last ones fewer or
    none)."""
    if rows < 0 or t < 1:
        raise ValueError(f"rows={rows}, t={t}: need rows >= 0 and t >= 1")
    c = math.ceil(rows / t) if rows else 0
    return [(min(r * c, rows), min((r + 1) * c, rows)) for r in range(t)]


def gathered_numel(shapes: Sequence[Sequence[int]], t: int) -> int:
    r"""Elements of one FSDP2 all-gather of a unit whose parameters have these shapes:
    $t \sum_p \lceil R_p/t \rceil |p|/R_p$ (every shard padded to the same rows)."""
    total = 0
    for shape in shapes:
        rows = shape[0] if len(shape) else 1
        rest = math.prod(shape[1:]) if len(shape) > 1 else 1
        total += math.ceil(rows / t) * rest
    return t * total


def step_bytes(units: Sequence[Sequence[Sequence[int]]], t: int,
               reshard_after_forward: Sequence[bool], *, dtype_bytes: int = 4
               ) -> dict[str, float]:
    """Bytes one rank sends in a training step of FSDP2 (ring algorithms), per kind:
    {"forward all-gather", "backward all-gather", "reduce-scatter", "total"}.

    units: the parameter shapes of each fully_shard unit; reshard_after_forward: one flag per
    unit (True: gathered again in backward)."""
    if len(units) != len(reshard_after_forward):
        raise ValueError(f"{len(units)} units but {len(reshard_after_forward)} reshard flags")
    share = (t - 1) / t * dtype_bytes
    sizes = [gathered_numel(shapes, t) for shapes in units]
    out = {"forward all-gather": share * sum(sizes),
           "backward all-gather": share * sum(n for n, r in zip(sizes, reshard_after_forward,
                                                                  strict=True) if r),
           "reduce-scatter": share * sum(sizes)}
    out["total"] = sum(out.values())
    return out


def owners_flat(out_features: int, in_features: int, t: int) -> torch.Tensor:
    """(out, in + 1) int tensor: the rank holding each element of [W | b] in the course's
    layer, whose rank r keeps elements [r n, (r+1) n) of [vec W; b], n = ceil(P/t)."""
    n_w = out_features * in_features
    n = math.ceil((n_w + out_features) / t)
    owner = torch.arange(n_w + out_features) // n  # (P,): element k -> rank k // n
    return torch.cat([owner[:n_w].view(out_features, in_features),
                      owner[n_w:].view(out_features, 1)], dim=1)


def owners_dim0(out_features: int, in_features: int, t: int) -> torch.Tensor:
    """(out, in + 1) int tensor: the rank holding each element of [W | b] under FSDP2 (W and b
    each Shard(0): row i of W and b[i] go to the rank holding row i)."""
    owner = torch.empty(out_features, dtype=torch.long)
    for rank, (start, end) in enumerate(dim0_rows(out_features, t)):
        owner[start:end] = rank
    return owner.unsqueeze(1).expand(out_features, in_features + 1).clone()


def shard_stack(model: nn.Module, mesh: Any, reshard_after_forward: Sequence[bool]
                ) -> nn.Module:
    """fully_shard every nn.Linear of `model` (in order) with its flag, then the root: one
    all-gather and one reduce-scatter per layer, each layer's weights freed after its forward
    where its flag says so (torchtitan's way). Returns `model`, sharded in place."""
    from torch.distributed.fsdp import fully_shard

    linears = [m for m in model.modules() if isinstance(m, nn.Linear)]
    if len(linears) != len(reshard_after_forward):
        raise ValueError(f"the model has {len(linears)} nn.Linear layers but "
                         f"{len(reshard_after_forward)} reshard flags: give one per layer")
    for layer, reshard in zip(linears, reshard_after_forward, strict=True):
        fully_shard(layer, mesh=mesh, reshard_after_forward=bool(reshard))
    fully_shard(model, mesh=mesh)  # the root: it has no parameters of its own here
    return model
