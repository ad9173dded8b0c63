r"""Graded checks of module 02, "Tensor parallelism" (exercises 1-3 here; 4-6, also importable
from here, in `parlab.check.tp_layers`; shared helpers in `parlab.check.tp_common`).

Every check runs the learner's code on `world_size` ranks through `parlab.check.ranks` and
compares it, rank by rank, with the single-device module built from the same seeded weights
(parlab.model.MLP, parlab.model.Attention and Block): outputs, the input gradient and the
gradient of every parameter shard. The tracer (`parlab.comm.trace`) counts the collectives of
the forward and of the backward pass separately.

Inputs and tolerances:
- f and g (exercise 1): rank r's input is filled with r and its upstream gradient with r + 1,
  in float64, so every expected value is a small whole number (t(t-1)/2, t(t+1)/2, r, r + 1)
  and the comparison is exact.
- the parallel linears (exercise 2) run in float64: the row-parallel sum adds the t partial
  products in a different order than one GEMM, which moves float64 results by ~1e-16, so
  rtol=1e-10, atol=1e-12 leaves no room for a real mistake.
- the MLP, attention and the layer (exercises 3-6) run in float32 like training: rtol=1e-5,
  atol=1e-6 (a different summation order moves float32 by ~1e-7 relative; a wrong shard or a
  missing all-reduce moves it by ~1e-1).

In the ranks, parlab's own TP classes (parlab.tp, parlab.tp_attention) raise CheckFailed when
used: an answer that re-exports, wraps or subclasses them is rejected.
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import Any

import torch

from parlab.check import CHECK_TIMEOUT_S, CheckFailed, assert_close, fail
from parlab.check.tp_common import (
    BIAS_ONCE,
    F32_TOL,
    F64_TOL,
    F_BACKWARD,
    G_BACKWARD,
    LINEAR_LAYOUT,
    ROW_FIRST,
    SEED,
    B,
    H,
    _backward,
    _bias_counted,
    _call,
    _close,
    _compare,
    _cpu,
    _env,
    _expect_events,
    _grads,
    _guard,
    _kinds,
    _mlp_setup,
    _mlp_shards,
    _param,
    _reject_reference,
    _run,
    _shard_story,
    _traced,
)

__all__ = ["check_f_g", "check_parallel_linears", "check_tp_mlp", "CheckFailed"]
# check_row_first, check_tp_attention and check_tp_block come from parlab.check.tp_layers
# (module __getattr__ at the bottom), so test cells import every check from here.


# --- exercise 1: f and g -------------------------------------------------------------------------

def _fg_worker(f: Callable, g: Callable) -> dict:
    rank, t, dev = _env()
    _guard()
    out = {}
    for name, op in (("f", f), ("g", g)):
        x = torch.full((3, 4), float(rank), dtype=torch.float64, device=dev, requires_grad=True)
        y, fwd = _traced(f"{name}(x)", op, x)
        after = _cpu(x)
        up = torch.full((3, 4), float(rank + 1), dtype=torch.float64, device=dev)
        bwd = _backward(f"{name}(x)", y, up, rank)
        out[name] = {"y": _cpu(y), "grad": _cpu(x.grad), "x_after": after, "forward": fwd,
                     "backward": bwd}
    return out


def _fg_story(name: str, part: str, got: Any, r: int, t: int) -> str:
    s0, s1 = t * (t - 1) / 2, t * (t + 1) / 2
    v = float(got.flatten()[0]) if isinstance(got, torch.Tensor) and got.numel() else None
    stories = {
        ("f", "forward"): {s0: "f's forward all-reduced: f is the identity in forward",
                           t * r: "f's forward multiplied by t"},
        ("f", "backward"): {r + 1: "f's backward returned the gradient unchanged: " + F_BACKWARD,
                            t * s1: "the gradient was all-reduced twice: " + F_BACKWARD
                            + ", once"},
        ("g", "forward"): {r: "g's forward returned its input: g's forward must all-reduce "
                              "(sum the ranks' partial results)",
                           t * s0: "g's forward all-reduced twice: once is the sum"},
        ("g", "backward"): {s1: "g's backward all-reduced: " + G_BACKWARD,
                            0.0: "g's backward returned zeros: " + G_BACKWARD},
    }[(name, part)]
    return next((h for val, h in stories.items() if v is not None and v == val and
                 bool((got == v).all())), f"see the table of f and g above ({name} {part})")


def check_f_g(f: Callable, g: Callable, *, world_size: int = 2,
              timeout: float = CHECK_TIMEOUT_S, quiet: bool = False) -> None:
    """f: forward identity / backward all-reduce; g: forward all-reduce / backward identity.

    Rank r's input is all r and its upstream gradient all r + 1 (float64, exact)."""
    _reject_reference(f, "f")
    _reject_reference(g, "g")
    t = world_size
    results = _run(_fg_worker, t, f, g, what="f and g", timeout=timeout)
    s0, s1 = t * (t - 1) / 2, t * (t + 1) / 2
    for rank, res in enumerate(results):
        want = {("f", "forward"): float(rank), ("f", "backward"): s1,
                ("g", "forward"): s0, ("g", "backward"): float(rank + 1)}
        for (name, part), value in want.items():
            got = res[name]["y" if part == "forward" else "grad"]
            if not isinstance(got, torch.Tensor):
                what = "gave no gradient for x" if part == "backward" else "is not a tensor"
                fail(f"{name}(x) {what}", rank=rank,
                     hint=f"the {part} of {name} must return a tensor like x")
            label = f"{name}(x)" if part == "forward" else f"grad of x through {name}"
            ctx = f" (x = {rank} everywhere on rank {rank}, upstream gradient = rank + 1)"
            assert_close(got, torch.full_like(got, value), name=label + ctx, rank=rank,
                         rtol=0, atol=0, hint=_fg_story(name, part, got, rank, t))
            if name == "g" and part == "forward" and not bool((res[name]["x_after"] == rank).all()):
                fail("g changed its input x in place", rank=rank,
                     hint="all-reduce a copy (x.clone()): the caller's tensor must not change")
        expected = {("f", "forward"): [], ("f", "backward"): ["all_reduce"],
                    ("g", "forward"): ["all_reduce"], ("g", "backward"): []}
        for (name, part), kinds in expected.items():
            got = [k for k, _, _ in res[name][part]]
            if got != kinds:
                fail(f"the {part} of {name} made these collective calls: "
                     f"{_kinds(res[name][part])}; expected {', '.join(kinds) or 'none'}",
                     rank=rank, hint="f: forward identity, backward all-reduce; g: forward "
                     "all-reduce, backward identity; nothing else")
    if not quiet:
        print(f"f and g OK on {t} ranks: f(x) = x and its backward sums to t(t+1)/2 = {s1:g}; "
              f"g(x) sums to t(t-1)/2 = {s0:g} and its backward passes r + 1 through")


# --- exercise 2: the column- and row-parallel linear layers --------------------------------------

def _linears_worker(column_cls: type, row_cls: type, seed: int) -> dict:
    rank, t, dev = _env()
    _guard()
    out: dict[str, Any] = {}
    for kind, cls, (k, n) in (("column", column_cls, (8, 12)), ("row", row_cls, (12, 8))):
        gen = torch.Generator().manual_seed(seed + (kind == "row"))
        full = torch.nn.Linear(k, n, dtype=torch.float64)
        with torch.no_grad():
            full.weight.copy_(torch.randn(n, k, generator=gen, dtype=torch.float64))
            full.bias.copy_(torch.randn(n, generator=gen, dtype=torch.float64))
        full = full.to(dev)
        x = torch.randn(B, 3, k, generator=gen, dtype=torch.float64).to(dev)
        up = torch.randn(B, 3, n, generator=gen, dtype=torch.float64).to(dev)
        xr = x.clone().requires_grad_()
        (full(xr) * up).sum().backward()
        ref = {"y": _cpu(full(x)), "x": _cpu(x), "x.grad": _cpu(xr.grad),
               "weight": _cpu(full.weight), "weight.grad": _cpu(full.weight.grad),
               "bias": _cpu(full.bias), "bias.grad": _cpu(full.bias.grad)}
        full.zero_grad()
        layer = _call(f"{cls.__name__}(linear)", cls, copy.deepcopy(full))
        want = (n // t, k) if kind == "column" else (n, k // t)
        w = _param(layer, "weight", rank)
        if tuple(w.shape) != want:
            fail(f"{cls.__name__}.weight has shape {tuple(w.shape)} for a Linear({k}, {n}) on "
                 f"{t} ranks; expected {want}", rank=rank, hint=LINEAR_LAYOUT)
        cols = slice(rank * k // t, (rank + 1) * k // t)
        rows = slice(rank * n // t, (rank + 1) * n // t)
        xin = (x if kind == "column" else x[..., cols]).clone().requires_grad_()
        y, fwd = _traced(f"{cls.__name__}.forward", layer, xin)
        upstream = up[..., rows] if kind == "column" else up
        bwd = _backward(f"{cls.__name__}.forward", y, upstream.contiguous(), rank)
        got = _grads(layer, ("weight", "bias"), rank)
        out[kind] = {"ref": ref, "y": _cpu(y), "x.grad": _cpu(xin.grad), "forward": fwd,
                     "backward": bwd, "rows": rows, "cols": cols,
                     **{p: v for p, (v, _) in got.items()},
                     **{p + ".grad": gr for p, (_, gr) in got.items()}}
    return out


def check_parallel_linears(column_cls: type, row_cls: type, *, world_size: int = 2,
                           seed: int = SEED, timeout: float = CHECK_TIMEOUT_S,
                           quiet: bool = False) -> None:
    """Each layer built from a full float64 nn.Linear; outputs and grads against its slices."""
    _reject_reference(column_cls, "ColumnParallelLinear")
    _reject_reference(row_cls, "RowParallelLinear")
    t = world_size
    results = _run(_linears_worker, t, column_cls, row_cls, seed,
                   what="ColumnParallelLinear and RowParallelLinear", timeout=timeout)
    for kind in ("column", "row"):
        name = f"{'Column' if kind == 'column' else 'Row'}ParallelLinear"
        rs = [r[kind] for r in results]
        for rank, r in enumerate(rs):
            shard = r["ref"]["weight"][r["rows"]] if kind == "column" \
                else r["ref"]["weight"][:, r["cols"]]
            assert_close(r["weight"], shard, name=f"{name}.weight", rank=rank, rtol=0, atol=0,
                         hint=_shard_story(kind, r["weight"], r["ref"]["weight"], rank, t))
            bias = r["ref"]["bias"][r["rows"]] if kind == "column" else r["ref"]["bias"]
            assert_close(r["bias"], bias, name=f"{name}.bias", rank=rank, rtol=0, atol=0,
                         hint="the column layer keeps its rows of the bias; the row layer "
                              "keeps the whole bias (added once, after the all-reduce)")
        if kind == "column":
            checks = [("output (this rank's slice of the features)", lambda r: r["y"],
                       lambda r: r["ref"]["y"][..., r["rows"]]),
                      ("grad of x (the replicated input)", lambda r: r["x.grad"],
                       lambda r: r["ref"]["x.grad"])]
        else:
            checks = [("output", lambda r: r["y"], lambda r: r["ref"]["y"]),
                      ("grad of x (this rank's slice of the input)", lambda r: r["x.grad"],
                       lambda r: r["ref"]["x.grad"][..., r["cols"]])]
        for rank, r in enumerate(rs):
            if kind == "row" and _bias_counted(r["y"], r["ref"]["y"], r["ref"]["bias"], t):
                fail(f"{name} output is off by (t - 1) x bias = {t - 1} x bias", rank=rank,
                     hint=BIAS_ONCE)
        _compare(rs, t, checks, F64_TOL)
        dim = "rows" if kind == "column" else "cols"
        _compare(rs, t, [
            (f"grad of {name}.weight", lambda r: r["weight.grad"],
             lambda r, k=kind, d=dim: r["ref"]["weight.grad"][r[d]] if k == "column"
             else r["ref"]["weight.grad"][:, r[d]]),
            (f"grad of {name}.bias", lambda r: r["bias.grad"],
             lambda r, k=kind: r["ref"]["bias.grad"][r["rows"]] if k == "column"
             else r["ref"]["bias.grad"])], F64_TOL)
        if kind == "column":
            _expect_events(rs, "forward", name, [], lambda ev: (
                "the column layer needs no communication in forward: every rank has the whole "
                "x and computes its own output features"))
            _expect_events(rs, "backward", name, ["all_reduce"], lambda ev: F_BACKWARD)
        else:
            _expect_events(rs, "forward", name, ["all_reduce"], lambda ev: (
                "the row layer sums the partial products with one all-reduce (g)"))
            _expect_events(rs, "backward", name, [], lambda ev: G_BACKWARD)
    if not quiet:
        print(f"ColumnParallelLinear and RowParallelLinear OK on {t} ranks: shards, outputs "
              f"and gradients match nn.Linear (float64, rtol={F64_TOL['rtol']:g})")


# --- exercise 3: the TP MLP -----------------------------------------------------------------------

def _mlp_worker(cls: type, seed: int) -> dict:
    rank, t, dev = _env()
    _guard()
    mlp, x, up, ref = _mlp_setup(seed, dev)
    model = _call(f"{cls.__name__}(mlp)", cls, copy.deepcopy(mlp))
    xin = x.clone().requires_grad_()
    y, fwd = _traced(f"{cls.__name__}.forward", model, xin)
    bwd = _backward(f"{cls.__name__}.forward", y, up, rank)
    params = ("fc1.weight", "fc1.bias", "fc2.weight", "fc2.bias")
    got = _grads(model, params, rank)
    return {"ref": ref, "y": _cpu(y), "x.grad": _cpu(xin.grad), "forward": fwd,
            "backward": bwd, **{p: v for p, (v, _) in got.items()},
            **{p + ".grad": g for p, (_, g) in got.items()}}


def check_tp_mlp(cls: type, *, world_size: int = 2, seed: int = SEED,
                 timeout: float = CHECK_TIMEOUT_S, quiet: bool = False) -> None:
    """TPMLP(mlp) against parlab.model.MLP in float32: output, grad of x and of all 4 params."""
    _reject_reference(cls, "TPMLP")
    t = world_size
    results = _run(_mlp_worker, t, cls, seed, what="TPMLP", timeout=timeout)
    for rank, r in enumerate(results):
        r["rank"] = rank
        swapped = tuple(r["fc1.weight"].shape) == (4 * H, H // t) and t > 1
        if swapped and not _close(r["y"], r["ref"]["y"], **F32_TOL):
            fail(f"the output differs from the MLP's, and fc1.weight has shape "
                 f"{tuple(r['fc1.weight'].shape)}: a row-parallel shard (expected "
                 f"{(4 * H // t, H)})", rank=rank, hint=ROW_FIRST)
        if _bias_counted(r["y"], r["ref"]["y"], r["ref"]["fc2.bias"], t):
            fail(f"the output is off by (t - 1) x fc2.bias = {t - 1} x fc2.bias", rank=rank,
                 hint=BIAS_ONCE)
    _compare(results, t, [("output", lambda r: r["y"], lambda r: r["ref"]["y"])], F32_TOL)

    def forward_hint(ev: list[tuple]) -> str:
        if len(ev) > 1:
            return f"{len(ev)} collectives counted in the forward: {ROW_FIRST}"
        return "the forward needs exactly one all-reduce, g, after fc2 (of the (B, T, C) output)"

    _expect_events(results, "forward", "TPMLP", ["all_reduce"], forward_hint)
    grads = [("grad of x (the MLP's input)", lambda r: r["x.grad"], lambda r: r["ref"]["x.grad"])]
    for p, shard in _mlp_shards(t):
        _compare(results, t, [(p, lambda r, p=p: r[p], lambda r, p=p, s=shard: s(r, p))],
                 {"rtol": 0, "atol": 0}, hint=LINEAR_LAYOUT)
        grads.append((f"grad of {p}", lambda r, p=p: r[p + ".grad"],
                      lambda r, p=p, s=shard: s(r, p + ".grad")))
    _compare(results, t, grads, F32_TOL)
    _expect_events(results, "backward", "TPMLP", ["all_reduce"], lambda ev: (
        F_BACKWARD if not ev else f"{len(ev)} collectives in backward: " + G_BACKWARD))
    if not quiet:
        print(f"TPMLP OK on {t} ranks: output and the gradients of x, fc1.weight, fc1.bias, "
              f"fc2.weight, fc2.bias match the single-device MLP (float32, "
              f"rtol={F32_TOL['rtol']:g}, atol={F32_TOL['atol']:g}); one all-reduce forward, "
              "one backward")


def __getattr__(name: str) -> Any:
    """Exercises 4 to 6 live in parlab.check.tp_layers; test cells reach them from here."""
    if name in ("check_row_first", "check_tp_attention", "check_tp_block"):
        from parlab.check import tp_layers

        return getattr(tp_layers, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
