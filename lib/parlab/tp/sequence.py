r"""Megatron sequence parallelism (Korthikanti et al. 2022): the operators, dropout, gradients.

Tensor parallelism (`parlab.tp`) splits attention and the MLP, but leaves the LayerNorms,
dropouts and residual additions working on the whole $(B, T, C)$ activation, the same on all
t ranks. Sequence parallelism splits those regions along the sequence: rank i keeps tokens
$i\frac{T}{t}$ to $(i+1)\frac{T}{t}-1$, a $(B, T/t, C)$ shard. They act token by token, so they
need no communication; what changes is how a block is entered and left:

| operator                                    | replaces | forward        | backward       |
|---------------------------------------------|----------|----------------|----------------|
| `gather_from_sequence_parallel_region`      | f        | all-gather     | reduce-scatter |
| `reduce_scatter_to_sequence_parallel_region`| g        | reduce-scatter | all-gather     |
| `scatter_to_sequence_parallel_region`       |          | own rows       | all-gather     |

A ring all-reduce IS a reduce-scatter then an all-gather: each sends $\frac{t-1}{t}n$ bytes,
the all-reduce $2\frac{t-1}{t}n$. Replacing f (identity / all-reduce) and g (all-reduce /
identity) by the pair above moves the same bytes as long as the column-parallel GEMMs keep the
gathered input for backward, as autograd does with `F.linear(gather(x), W)`: per layer
$8\frac{t-1}{t}bsh\,e$ against TP's $4\cdot 2\frac{t-1}{t}bsh\,e$ with $e$ bytes per element
(`sp_bytes_per_layer`); between the reduce-scatter and the next all-gather each rank holds
only $1/t$ of the activation. Megatron-LM keeps only the shard and all-gathers it again in
backward (`parlab.tp.regather`, `sp_bytes_per_layer(..., regather=True)`): two all-gathers more,
$10\frac{t-1}{t}bsh\,e$, for $4\frac{t-1}{t}sbh$ fewer bytes kept in bf16
(`parlab.costs.activations`).

Two more things follow from the split:
- a parameter every rank holds whole but applies to its own tokens only (LayerNorm weight and
  bias, the bias added after a reduce-scatter) gets a partial gradient on each rank; the sum
  over ranks is the true one: `allreduce_sequence_parallel_grads` after backward;
- dropout on a shard must draw the mask the single device would draw for those tokens:
  every rank seeds one generator identically, draws the mask of the WHOLE $(B, T, C)$
  activation and keeps its rows (`sequence_parallel_dropout`). Drawing a $(B, T/t, C)$ mask
  from the same seed on every rank gives every shard the same pattern.

Activations are $(B, T, C)$, so the sequence is dim 1 (`SEQ_DIM`; Megatron's $(T, B, C)$
layout uses dim 0). Every function takes `group=None` (the default group); without
torch.distributed every operator is the identity (t = 1). Collectives are called as
`dist.all_gather(...)` / `dist.reduce_scatter(...)` (list forms), so `parlab.comm` sees them.
"""

from __future__ import annotations

from collections.abc import Iterable

import torch
import torch.distributed as dist
from torch import Tensor, nn

from parlab import costs
from parlab.tp.mappings import SEQ_DIM, divisible, tp_rank_and_size

__all__ = [
    "dropout_keep_mask", "hidden_dropout", "sequence_parallel_dropout",
    "allreduce_sequence_parallel_grads", "column_shard", "row_shard", "sp_bytes_per_layer",
]


def _rows(n: int, t: int) -> int:
    return divisible(n, t, "the sequence length", "pick a sequence length that t divides")


# --- dropout on sequence shards -------------------------------------------------------------

def dropout_keep_mask(shape: tuple[int, ...], *, p_drop: float, generator: torch.Generator,
                      device: torch.device | str | None = None) -> Tensor:
    """Bool mask, True = keep: `torch.rand(shape, generator=generator) >= p_drop` (drawn on
    the CPU generator, then moved to `device`). Each call advances the generator by
    prod(shape). `p_drop` is the probability that an element is dropped."""
    if not 0 <= p_drop < 1:
        raise ValueError(f"p_drop must be a probability in [0, 1), got {p_drop!r}")
    return (torch.rand(shape, generator=generator) >= p_drop).to(device)


def hidden_dropout(x: Tensor, *, p_drop: float, generator: torch.Generator) -> Tensor:
    """Single-device dropout of a whole (B, T, C) activation: x * keep / (1 - p_drop)."""
    return x * dropout_keep_mask(tuple(x.shape), p_drop=p_drop, generator=generator,
                                 device=x.device) / (1 - p_drop)


def _shard_keep_mask(shape: tuple[int, ...], p_drop: float, generator: torch.Generator,
                     group: dist.ProcessGroup | None, device: torch.device) -> Tensor:
    """This rank's rows of the whole (B, T, C) mask: (B, T/t, C), bool."""
    rank, t = tp_rank_and_size(group)
    n = shape[SEQ_DIM]
    full = list(shape)
    full[SEQ_DIM] = n * t
    mask = dropout_keep_mask(tuple(full), p_drop=p_drop, generator=generator)  # (B, T, C)
    # clone: a narrowed view would keep the whole (B, T, C) mask alive until backward
    return mask.narrow(SEQ_DIM, rank * n, n).clone().to(device)  # (B, T/t, C)


def sequence_parallel_dropout(x: Tensor, *, p_drop: float, generator: torch.Generator,
                              group: dist.ProcessGroup | None = None) -> Tensor:
    """Dropout of this rank's (B, T/t, C) shard with the single-device mask of its tokens.

    Every rank seeds `generator` the same way and draws the mask of the whole (B, T, C)
    activation, so the masks are the single device's, whatever t is; the cost is t times the
    random numbers a shard needs (a counter-based generator, Philox on GPUs, could jump to the
    rank's offset instead)."""
    return x * _shard_keep_mask(tuple(x.shape), p_drop, generator, group, x.device) / (1 - p_drop)


# --- gradients of replicated parameters -----------------------------------------------------

def _allreduce_grads(grads: list[Tensor], group: dist.ProcessGroup | None) -> None:
    flat = torch.cat([g.reshape(-1) for g in grads])  # one collective for all of them
    dist.all_reduce(flat, group=group)
    for g, part in zip(grads, flat.split([g.numel() for g in grads]), strict=True):
        g.copy_(part.view_as(g))


def allreduce_sequence_parallel_grads(params: Iterable[nn.Parameter], *,
                                      group: dist.ProcessGroup | None = None) -> None:
    """Sum over the group the gradients of parameters that every rank holds whole but used on
    its own tokens only (LayerNorms, biases added after a reduce-scatter). Call after backward,
    once per step, like Megatron's finalize_model_grads. One all-reduce of all of them."""
    grads = [p.grad for p in params if p.grad is not None]
    if grads and tp_rank_and_size(group)[1] > 1:
        _allreduce_grads(grads, group)


# --- tensor-parallel shards as plain nn.Linear ------------------------------------------------

def column_shard(linear: nn.Linear, *, group: dist.ProcessGroup | None = None) -> nn.Linear:
    """This rank's output features: weight rows r*n:(r+1)*n, (out/t, in); bias the same rows."""
    rank, t = tp_rank_and_size(group)
    n = divisible(linear.out_features, t, "out_features", "pick a width that t divides")
    w = linear.weight
    out = nn.Linear(linear.in_features, n, bias=linear.bias is not None, device=w.device,
                    dtype=w.dtype)
    with torch.no_grad():
        out.weight.copy_(w[rank * n:(rank + 1) * n])
        if linear.bias is not None:
            out.bias.copy_(linear.bias[rank * n:(rank + 1) * n])
    return out


def row_shard(linear: nn.Linear, *, group: dist.ProcessGroup | None = None) -> nn.Linear:
    """This rank's input features: weight columns r*n:(r+1)*n, (out, in/t); the WHOLE bias,
    to be added once, after the partial products are summed (not by calling the layer)."""
    rank, t = tp_rank_and_size(group)
    n = divisible(linear.in_features, t, "in_features", "pick a width that t divides")
    w = linear.weight
    out = nn.Linear(n, linear.out_features, bias=linear.bias is not None, device=w.device,
                    dtype=w.dtype)
    with torch.no_grad():
        out.weight.copy_(w[:, rank * n:(rank + 1) * n])
        if linear.bias is not None:
            out.bias.copy_(linear.bias)
    return out


def sp_bytes_per_layer(b: int, s: int, h: int, t: int, dtype_bytes: int = 2, *,
                       regather: bool = False) -> dict[str, float]:
    r"""Bytes each rank sends per layer, forward + backward, under TP + SP, by collective.

    Forward: an all-gather entering attention and the MLP, a reduce-scatter leaving each;
    backward: their conjugates. Each moves the $b\cdot s\cdot h$ activation, sending
    $\frac{t-1}{t}bsh\,e$ ($e$ = dtype_bytes): 4 all-gathers and 4 reduce-scatters,
    $8\frac{t-1}{t}bsh\,e$ in all, equal to `parlab.costs.tp_bytes_per_layer`, when the GEMMs
    keep the gathered input (`SPBlock`'s default, module 03's block). regather=True adds the
    backward's re-gathers of the two LayerNorm outputs (Megatron-LM, `SPBlock(regather=True)`):
    6 all-gathers, $10\frac{t-1}{t}bsh\,e$."""

    n = b * s * h * dtype_bytes
    return {"all_gather": (6 if regather else 4) * costs.ring_allgather_bytes(n, t),
            "reduce_scatter": 4 * costs.ring_reduce_scatter_bytes(n, t)}
