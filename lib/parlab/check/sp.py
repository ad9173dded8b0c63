r"""Graded checks of module 03, "Sequence parallelism": exercises 1 and 2 here; 3 and 4 (the
layer and its bytes) in `parlab.check.sp_block`, 5 (saved tensors) in `parlab.check.sp_memory`,
all importable from here. Shared helpers: `parlab.check.sp_common`.

Exercise 1, the conjugate pair, in float64 with values known in advance, compared exactly.
On t ranks with T/t = 3 rows each (T = 3t), every value is tagged with its global token
position s:
- gather: rank r's shard holds s (its rows' positions); the upstream gradient on rank r is
  (r + 1)(s + 1). Forward must give s for all T tokens; backward, on rank r's rows,
  $\sum_q (q+1)(s+1) = \frac{t(t+1)}{2}(s+1)$.
- reduce-scatter: rank r's (B, T, C) input holds (r + 1)(s + 1); the upstream gradient is s on
  its rows. Forward must give $\frac{t(t+1)}{2}(s+1)$ on rank r's rows; backward s everywhere.
Exercise 2, dropout on a shard: the keep-masks of the whole (B, T, C) activation drawn by
`parlab.tp.dropout_keep_mask` from a generator seeded the same way; compared exactly (values
x / (1 - p) with p = 0.5 are exact), twice in a row from one generator, and the bytes the
function saves for backward (a bool mask of its rows: 1 byte per element).

In the ranks, parlab's own sequence-parallel code raises CheckFailed when used.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from parlab.check import CHECK_TIMEOUT_S, CheckFailed, assert_close, fail
from parlab.check.sp_common import (
    EXACT,
    GATHER_BACKWARD,
    INTO_TENSOR,
    RS_BACKWARD,
    RS_FORWARD,
    SAME_SEED,
    SEQ_DIM,
    _backward,
    _call,
    _cpu,
    _env,
    _expect_kinds,
    _guard,
    _reject_reference,
    _rows,
    _run,
    _story,
    _traced,
)

__all__ = ["check_sp_pair", "check_sp_dropout", "CheckFailed"]
_LATER = {"check_sp_block": "sp_block", "check_sp_bytes": "sp_block",
          "check_saved_bytes": "sp_memory"}
ROWS, C = 3, 4  # rows per rank and hidden size of exercise 1 (B = 2)


# --- exercise 1: the conjugate pair ---------------------------------------------------------

def _tags(rank: int, t: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(rank's shard of positions s, (B, T/t, C); (rank+1)(s+1) for all T tokens, (B, T, C))."""
    s = torch.arange(ROWS * t, dtype=torch.float64).view(1, -1, 1).expand(2, -1, C)
    return _rows(s, rank, t).contiguous(), ((rank + 1) * (s + 1)).contiguous()


def _pair_worker(gather: Callable, reduce_scatter: Callable) -> dict:
    rank, t, dev = _env()
    _guard()
    shard, weighted = _tags(rank, t)
    out: dict[str, Any] = {}
    for name, op, x0, up in (("gather", gather, shard, weighted),
                             ("reduce_scatter", reduce_scatter, weighted, shard)):
        try:
            out[name] = _pair_one(name, op, x0, up, rank, t, dev)
        except CheckFailed as exc:  # reported by the parent in the order it checks things
            out[name] = {"error": str(exc)}
    return out


def _pair_one(name: str, op: Callable, x0: torch.Tensor, up: torch.Tensor, rank: int, t: int,
              dev: torch.device) -> dict:
    x = x0.clone().to(dev).requires_grad_()
    y, fwd = _traced(f"{name}(x)", op, x)
    changed = not torch.equal(_cpu(x), x0)
    want = (2, ROWS * t, C) if name == "gather" else (2, ROWS, C)
    what = ("the all-gather returns all T tokens: (B, T/t, C) -> (B, T, C)" if name ==
            "gather" else "the reduce-scatter returns this rank's rows: (B, T, C) -> "
            "(B, T/t, C)")
    if not isinstance(y, torch.Tensor) or tuple(y.shape) != want:
        return {"y": _cpu(y), "grad": None, "forward": fwd, "backward": [], "changed": changed}
    bwd = _backward(f"{name}(x)", y, up.to(dev), rank, what)
    return {"y": _cpu(y), "grad": _cpu(x.grad), "forward": fwd, "backward": bwd,
            "changed": changed}


def _pair_stories(name: str, part: str, rank: int, t: int) -> list[tuple[Any, str]]:
    shards = [_tags(q, t)[0] for q in range(t)]
    s = torch.cat(shards, dim=1)  # (B, T, C): positions
    weighted = _tags(rank, t)[1]
    total = t * (t + 1) / 2 * (s + 1)
    mixed = torch.cat(shards, dim=0).reshape(s.shape)
    others = [(_rows(total, q, t), f"it holds rank {q}'s rows: rank r keeps rows "
               f"r*T/t:(r+1)*T/t") for q in range(t) if q != rank]
    return {
        ("gather", "forward"): [(mixed, INTO_TENSOR), (_rows(s, rank, t), "the forward returned "
                                "this rank's shard: the all-gather must return all T tokens")],
        ("gather", "backward"): [
            (_rows(weighted, rank, t), "the backward kept this rank's rows of the gradient "
             "without summing over ranks: " + GATHER_BACKWARD),
            (total, "the backward returned the summed gradient of all T tokens (an all-reduce) "
             "instead of this rank's rows: " + GATHER_BACKWARD),
            (weighted, "the backward returned the upstream gradient unchanged: "
             + GATHER_BACKWARD)] + others,
        ("reduce_scatter", "forward"): [
            (total, "the forward summed but kept all T tokens (an all-reduce): " + RS_FORWARD),
            (_rows(weighted, rank, t), "the forward kept this rank's rows without summing "
             "over ranks: " + RS_FORWARD), (weighted, "the forward returned its input: "
             + RS_FORWARD)] + others,
        ("reduce_scatter", "backward"): [
            (mixed, INTO_TENSOR), (t * s, "the backward summed the gathered gradients over "
                                   "ranks: gathering is enough. " + RS_BACKWARD),
            (_rows(s, rank, t), "the backward returned this rank's rows only: "
             + RS_BACKWARD)],
    }[(name, part)]


def check_sp_pair(gather: Callable, reduce_scatter: Callable, *, world_size: int = 2,
                  timeout: float = CHECK_TIMEOUT_S, quiet: bool = False) -> None:
    """gather: forward all-gather, backward reduce-scatter; reduce_scatter: forward
    reduce-scatter, backward all-gather; along dim 1 of (B, T, C), exactly (see above)."""
    _reject_reference(gather, "gather")
    _reject_reference(reduce_scatter, "reduce_scatter")
    t = world_size
    results = _run(_pair_worker, t, gather, reduce_scatter, what="the sequence-parallel pair",
                   timeout=timeout)
    s1 = t * (t + 1) / 2
    for rank, res in enumerate(results):
        s = torch.cat([_tags(q, t)[0] for q in range(t)], dim=1)
        want = {("gather", "forward"): s, ("gather", "backward"): _rows(s1 * (s + 1), rank, t),
                ("reduce_scatter", "forward"): _rows(s1 * (s + 1), rank, t),
                ("reduce_scatter", "backward"): s}
        for (name, part), expected in want.items():
            if "error" in res[name]:
                raise CheckFailed(res[name]["error"])
            got = res[name]["y" if part == "forward" else "grad"]
            label = (f"{name}(x)" if part == "forward" else f"grad of x through {name}") + (
                f" (values tagged with each token's position s, rank {rank} of {t})")
            if not isinstance(got, torch.Tensor):
                fail(f"{label} is {type(got).__name__}, expected a tensor of shape "
                     f"{tuple(expected.shape)}", rank=rank,
                     hint=f"the {part} of {name} must return a tensor")
            hint = _story(got, _pair_stories(name, part, rank, t))
            if hint is None and got.shape != expected.shape:
                hint = SEQ_DIM
            assert_close(got, expected, name=label, rank=rank, **EXACT, hint=hint)
        if res["reduce_scatter"]["changed"] or res["gather"]["changed"]:
            fail("your function changed its input x in place", rank=rank,
                 hint="communicate copies (x.clone(), or new tensors): the caller's tensor "
                      "must not change")
    for name, fwd, bwd in (("gather", "all_gather", "reduce_scatter"),
                           ("reduce_scatter", "reduce_scatter", "all_gather")):
        sub = [r[name] for r in results]
        _expect_kinds(sub, "forward", name, [fwd], f"{name}'s forward is one {fwd}")
        _expect_kinds(sub, "backward", name, [bwd], GATHER_BACKWARD if name == "gather"
                      else RS_BACKWARD)
    if not quiet:
        print(f"gather and reduce_scatter OK on {t} ranks: forward and backward exact, one "
              f"collective each way; the gather's backward sums to t(t+1)/2 (s+1) = {s1:g} (s+1)")


# --- exercise 2: dropout on sequence shards -------------------------------------------------

def _full_input(t: int) -> torch.Tensor:
    return (1 + torch.arange(2 * 4 * t * 8, dtype=torch.float64) / 64).reshape(2, 4 * t, 8)


def _dropout_worker(dropout: Callable, p: float, seed: int) -> dict:
    from parlab.costs.activations import SavedTensorMeter

    rank, t, dev = _env()
    meter = SavedTensorMeter()
    enter = meter.__enter__  # bound before the guard blocks parlab's meter for the learner
    _guard()
    x = _rows(_full_input(t), rank, t).contiguous().to(dev).requires_grad_()  # (2, 4, 8)
    gen = torch.Generator().manual_seed(seed)
    enter()
    try:
        first = _call_dropout(dropout, x, p, gen)
    finally:
        meter.__exit__(None, None, None)
    second = _call_dropout(dropout, x.detach(), p, gen)
    again = _call_dropout(dropout, x.detach(), p, torch.Generator().manual_seed(seed))
    grad = None
    if isinstance(first, torch.Tensor) and first.shape == x.shape and first.requires_grad:
        first.sum().backward()
        grad = _cpu(x.grad)
    return {"first": _cpu(first), "second": _cpu(second), "again": _cpu(again), "grad": grad,
            "saved": meter.total, "numel": x.numel()}


def _call_dropout(dropout: Callable, x: torch.Tensor, p: float, gen: torch.Generator) -> Any:
    return _call("sp_dropout(x, p, generator)", dropout, x, p, gen)


def check_sp_dropout(dropout: Callable, *, world_size: int = 2, p: float = 0.5, seed: int = 7,
                     timeout: float = CHECK_TIMEOUT_S, quiet: bool = False) -> None:
    """sp_dropout(x, p, generator) on rank r's (2, 4, 8) shard of a (2, 4t, 8) activation must
    equal rows r of hidden_dropout on the whole activation, drawn from the same seed."""
    from parlab.tp.sequence import dropout_keep_mask

    _reject_reference(dropout, "sp_dropout")
    t = world_size
    results = _run(_dropout_worker, t, dropout, p, seed, what="sp_dropout", timeout=timeout)
    full = _full_input(t)
    gen = torch.Generator().manual_seed(seed)
    keeps = [dropout_keep_mask(tuple(full.shape), p=p, generator=gen) for _ in range(2)]
    masks = [r["first"] != 0 if isinstance(r["first"], torch.Tensor) else None for r in results]
    for rank, r in enumerate(results):
        want = _rows(full * keeps[0] / (1 - p), rank, t)
        same = t > 1 and all(m is not None and m.shape == masks[0].shape and torch.equal(
            m, masks[0]) for m in masks)
        hint = SAME_SEED if same else _story(r["first"], [
            (_rows(full * keeps[0], rank, t), "the kept values must be scaled by 1/(1 - p)")] + [
            (_rows(full * keeps[0] / (1 - p), q, t), f"it applies rank {q}'s rows of the mask: "
             "rank r keeps rows r*T/t:(r+1)*T/t") for q in range(t) if q != rank])
        assert_close(r["first"], want, name=f"sp_dropout(x) (p = {p}, seed {seed})", rank=rank,
                     **EXACT, hint=hint or "draw the mask exactly as hidden_dropout does, for "
                     "the whole (B, T, C) activation: keep = torch.rand((B, T, C), "
                     "generator=generator) >= p; then keep this rank's rows")
        assert_close(r["grad"], _rows(keeps[0] / (1 - p), rank, t).double(), name="grad of x "
                     "through sp_dropout", rank=rank, **EXACT,
                     hint="let autograd see x * keep / (1 - p): do not detach")
        assert_close(r["second"], _rows(full * keeps[1] / (1 - p), rank, t),
                     name="a second sp_dropout call with the same generator", rank=rank, **EXACT,
                     hint="each call draws the next whole mask from the generator it is given: "
                          "do not re-seed it or make a new one inside sp_dropout")
        assert_close(r["again"], r["first"], name="sp_dropout with a fresh generator of the "
                     "same seed", rank=rank, **EXACT, hint="the same seed must give the same "
                     "masks: use only the generator passed in")
        if r["saved"] > r["numel"]:
            whole = r["saved"] == t * r["numel"]
            fail(f"sp_dropout keeps {r['saved']} bytes for backward for a shard of "
                 f"{r['numel']} elements; a bool mask of its rows needs {r['numel']}", rank=rank,
                 hint="it keeps the whole (B, T, C) mask alive: a slice is a view of it; "
                      ".clone() your rows" if whole else "keep the mask as bool (1 byte per "
                      "element) and multiply by it: a float mask costs 4 bytes per element")
    if not quiet:
        print(f"sp_dropout OK on {t} ranks: each shard's mask is its rows of the single-device "
              f"mask (p = {p}, seed {seed}), call after call; it keeps 1 byte per element")


def __getattr__(name: str) -> Any:
    """Exercises 3 to 5 live in parlab.check.sp_block and sp_memory; reached from here."""
    if name in _LATER:
        import importlib

        return getattr(importlib.import_module(f"parlab.check.{_LATER[name]}"), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
