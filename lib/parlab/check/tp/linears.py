r"""Module 02, exercise 2: the column- and row-parallel linear layers.

Each layer is built from a full float64 nn.Linear with random weights, the same on every rank:
the column layer from Linear(10, 24) (t splits the 24 output features), the row layer from
Linear(24, 10) (t splits the 24 input features). Neither 10 nor 24 is a power of two, and 10
is not divisible by t, so a shard taken along the wrong dimension cannot pass by chance.
`features=(unsplit, split)` sets other sizes (the hidden tests: (7, 15) on 3 ranks), so a shard
size written in as 24 // t fails.

Shards are compared exactly and must own their memory (a view of the full weight keeps all of
it alive); outputs and gradients against the matching slices of the full layer's, at
rtol=1e-10, atol=1e-12 (the row layer's partial sums are added in another order than one GEMM,
which moves float64 by ~1e-16). The inputs must be left unchanged.

A right answer does not depend on, and the tests vary: the layer's sizes (visible Linear(10,
24) on 2 ranks and Linear(7, 15) on 3, hidden 24 on 3 and 4 ranks), the world size (visible 2
and 3, hidden 4), the weights, inputs and upstream gradient (random, float64), which rank
holds which block (each rank's shard compared with its own slice).
"""

from __future__ import annotations

from typing import Any

import torch

from parlab.check._compare import assert_close, fail
from parlab.check._harness import CHECK_TIMEOUT_S, call_learner, exercise, run_checked
from parlab.check.tp import hints
from parlab.check.tp.common import (
    F64_TOL,
    SEED,
    B,
    backward,
    cpu,
    env,
    grads,
    guard,
    handed,
    learner_mode,
    nonleaf,
    owns_only,
    param,
    traced,
    unchanged,
)
from parlab.check.tp.compare import (
    bias_counted,
    compare,
    expect_events,
    got,
    part,
    reject_reference,
    shard_story,
)
from parlab.check.tp.keys import F_G, KEY_LINEARS

__all__ = ["check_parallel_linears"]
FEATURES = (10, 24)  # (unsplit, split): the features t leaves whole and those it divides


def _sizes(kind: str, features: tuple[int, int]) -> tuple[int, int]:
    """(in_features, out_features) of the full layer: Linear(10, 24) column, (24, 10) row."""
    return features if kind == "column" else (features[1], features[0])


def _full(kind: str, seed: int, dev: torch.device,
          features: tuple[int, int]) -> tuple[torch.nn.Linear, torch.Tensor, torch.Tensor]:
    k, n = _sizes(kind, features)
    gen = torch.Generator().manual_seed(seed + (kind == "row"))
    full = torch.nn.Linear(k, n, dtype=torch.float64)
    with torch.no_grad():
        full.weight.copy_(torch.randn(n, k, generator=gen, dtype=torch.float64))
        full.bias.copy_(torch.randn(n, generator=gen, dtype=torch.float64))
    x = torch.randn(B, 3, k, generator=gen, dtype=torch.float64).to(dev)
    up = torch.randn(B, 3, n, generator=gen, dtype=torch.float64).to(dev)
    return full.to(dev), x, up


def _one_layer(kind: str, cls: type, seed: int, rank: int, t: int, dev: torch.device,
               features: tuple[int, int]) -> dict:
    full, x, up = _full(kind, seed, dev, features)
    k, n = _sizes(kind, features)
    ref: dict = {}
    if not learner_mode():  # the verifier makes the reference on trusted ranks
        xr = x.clone().requires_grad_()
        (full(xr) * up).sum().backward()
        ref = {"y": cpu(full(x)), "x.grad": cpu(xr.grad), **grads(full, ("weight", "bias"), rank)}
        full.zero_grad()
    layer = call_learner(f"{cls.__name__}(linear)", cls, handed(full, {"": kind}, rank, t),
                         shape_hint=hints.LINEAR_LAYOUT)
    want = (n // t, k) if kind == "column" else (n, k // t)
    w = param(layer, "weight", rank)
    if tuple(w.shape) != want:
        split_dim = 0 if kind == "column" else 1
        fixed = w.dim() == 2 and w.shape[1 - split_dim] == want[1 - split_dim]
        fail(f"{cls.__name__}.weight has shape {tuple(w.shape)} for a Linear({k}, {n}) on "
             f"{t} ranks; expected {want}", rank=rank,
             hint=hints.SIZE_FROM_LAYER if fixed else hints.LINEAR_LAYOUT)
    owns_only(layer, rank)
    cols = slice(rank * k // t, (rank + 1) * k // t)
    rows = slice(rank * n // t, (rank + 1) * n // t)
    given = (x if kind == "column" else x[..., cols]).contiguous()
    leaf, xin = nonleaf(given)
    y, fwd = traced(f"{cls.__name__}.forward", layer, xin)
    unchanged(given, xin, f"x (the tensor given to {cls.__name__}.forward)", rank)
    upstream = up[..., rows] if kind == "column" else up
    bwd = backward(f"{cls.__name__}.forward", y, upstream.contiguous(), rank)
    return {"ref": ref, "y": cpu(y), "x.grad": cpu(leaf.grad), "forward": fwd, "backward": bwd,
            "rows": rows, "cols": cols, **grads(layer, ("weight", "bias"), rank)}


def _linears_worker(column_cls: type, row_cls: type, seed: int,
                    features: tuple[int, int]) -> dict:
    rank, t, dev = env()
    guard()
    return {kind: _one_layer(kind, cls, seed, rank, t, dev, features)
            for kind, cls in (("column", column_cls), ("row", row_cls))}


def _slice(r: dict, key: str, kind: str) -> torch.Tensor:
    """The reference's slice this rank's layer must hold of `key` (weight, bias, or grads)."""
    full = r["ref"][key]
    if key.startswith("bias"):
        return full[r["rows"]] if kind == "column" else full
    return full[r["rows"]] if kind == "column" else full[:, r["cols"]]


def _check_shards(rs: list[dict], kind: str, name: str, t: int) -> None:
    for rank, r in enumerate(rs):
        assert_close(r["weight"], _slice(r, "weight", kind), name=f"{name}.weight", rank=rank,
                     rtol=0, atol=0,
                     hint=shard_story(kind, r["weight"], r["ref"]["weight"], rank, t))
        assert_close(r["bias"], _slice(r, "bias", kind), name=f"{name}.bias", rank=rank,
                     rtol=0, atol=0, hint="the column layer keeps its rows of the bias; the row "
                     "layer keeps the whole bias (added once, after the all-reduce)")


def _check_layer(rs: list[dict], kind: str, t: int) -> None:
    name = f"{'Column' if kind == 'column' else 'Row'}ParallelLinear"
    _check_shards(rs, kind, name, t)
    if kind == "row":
        for rank, r in enumerate(rs):
            if bias_counted(r["y"], r["ref"]["y"], r["ref"]["bias"], t):
                fail(f"{name} output is off by (t - 1) x bias = {t - 1} x bias", rank=rank,
                     hint=hints.BIAS_ONCE)
    out_name = "output (this rank's slice of the features)" if kind == "column" else "output"
    x_name = ("grad of x (the replicated input)" if kind == "column"
              else "grad of x (this rank's slice of the input)")
    compare(rs, t, [(out_name, lambda r: r["y"], lambda r: r["ref"]["y"][..., r["rows"]]
                     if kind == "column" else r["ref"]["y"])], F64_TOL,
            hint="the shards are right, so look at forward: the column layer computes "
                 "F.linear(f(x), self.weight, self.bias), the row layer "
                 "g(F.linear(x, self.weight)) + self.bias")
    compare(rs, t, [(f"grad of {name}.{p}", got(f"{p}.grad"),
                     part(lambda r, key: _slice(r, key, kind), f"{p}.grad"))
                    for p in ("weight", "bias")],
            F64_TOL, hint=hints.GRAD_HINT)  # the weights' gradients first: they tell f from g
    compare(rs, t, [(x_name, lambda r: r["x.grad"], lambda r: r["ref"]["x.grad"]
                     if kind == "column" else r["ref"]["x.grad"][..., r["cols"]])], F64_TOL,
            hint=hints.GRAD_HINT)
    if kind == "column":
        expect_events(rs, "forward", name, [], lambda ev: (
            "the column layer needs no communication in forward: every rank has the whole "
            "x and computes its own output features"))
        expect_events(rs, "backward", name, ["all_reduce"], lambda ev: hints.F_BACKWARD)
    else:
        expect_events(rs, "forward", name, ["all_reduce"], lambda ev: (
            "the row layer sums the partial products with one all-reduce (g)"))
        expect_events(rs, "backward", name, [], lambda ev: hints.G_BACKWARD)


@exercise(KEY_LINEARS, needs=F_G)
def check_parallel_linears(column_cls: type, row_cls: type, *, world_size: int = 2,
                           seed: int = SEED, features: tuple[int, int] = FEATURES,
                           timeout: float = CHECK_TIMEOUT_S, quiet: bool = False) -> None:
    """Each layer built from a full float64 nn.Linear; outputs and grads against its slices.
    `features` = (unsplit, split): the column layer is Linear(unsplit, split), the row layer
    Linear(split, unsplit); t must divide split."""
    reject_reference(column_cls, "ColumnParallelLinear")
    reject_reference(row_cls, "RowParallelLinear")
    t = world_size
    if features[1] % t:
        raise ValueError(f"features={features}: t = {t} must divide the split features")
    results: list[dict[str, Any]] = run_checked(
        _linears_worker, t, column_cls, row_cls, seed, tuple(features), timeout=timeout,
        hang_hint=hints.HANG,
        what="ColumnParallelLinear and RowParallelLinear")
    for kind in ("column", "row"):
        _check_layer([r[kind] for r in results], kind, t)
    if not quiet:
        k, n = features
        print(f"ColumnParallelLinear and RowParallelLinear OK on {t} ranks: shards, outputs "
              f"and gradients match nn.Linear({k}, {n}) and nn.Linear({n}, {k}) (float64, "
              f"rtol={F64_TOL['rtol']:g})")
