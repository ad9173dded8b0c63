r"""Module 03, exercise 1: the conjugate pair that replaces f and g.

In float64 with values known in advance, compared exactly. On t ranks with T/t = 3 rows each
(T = 3t), every value is tagged with its global token position s:
- gather: rank r's shard holds s (its rows' positions); the upstream gradient on rank r is
  (r + 1)(s + 1). Forward must give s for all T tokens; backward, on rank r's rows,
  $\sum_q (q+1)(s+1) = \frac{t(t+1)}{2}(s+1)$.
- reduce-scatter: rank r's (B, T, C) input holds (r + 1)(s + 1); the upstream gradient is s on
  its rows. Forward must give $\frac{t(t+1)}{2}(s+1)$ on rank r's rows; backward s everywhere.
Neither function may change its input; each makes one collective in each pass.

A right answer must not depend on the number of ranks t (the visible test runs 2 and 3 ranks,
the hidden one 4: a list of two parts, or "the other rank", fails at 3), on the batch or the
hidden size (taken from x), or on the values (position-tagged here, random in the layer).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from parlab.check._compare import assert_close, fail
from parlab.check._harness import CHECK_TIMEOUT_S, exercise, run_checked
from parlab.check.sp.common import (
    EXACT,
    GATHER_BACKWARD,
    HANG,
    INTO_TENSOR,
    KEY_PAIR,
    KIND,
    RS_BACKWARD,
    RS_FORWARD,
    SEQ_DIM,
    expect_kinds,
    guard,
    reject_reference,
    rows,
    story,
)
from parlab.check.tp.common import backward, cpu, env, traced
from parlab.errors import CheckFailed

__all__ = ["check_sp_pair"]
ROWS, C = 3, 4  # rows per rank and hidden size of this exercise (B = 2)


def _tags(rank: int, t: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(rank's shard of positions s, (B, T/t, C); (rank+1)(s+1) for all T tokens, (B, T, C))."""
    s = torch.arange(ROWS * t, dtype=torch.float64).view(1, -1, 1).expand(2, -1, C)
    return rows(s, rank, t).contiguous(), ((rank + 1) * (s + 1)).contiguous()


def _pair_one(name: str, op: Callable, x0: torch.Tensor, up: torch.Tensor, rank: int, t: int,
              dev: torch.device) -> dict:
    x = x0.clone().to(dev).requires_grad_()
    y, fwd = traced(f"{name}(x)", op, x, shape_hint=SEQ_DIM, rename=KIND)
    changed = not torch.equal(cpu(x), x0)
    want = (2, ROWS * t, C) if name == "gather" else (2, ROWS, C)
    what = ("the all-gather returns all T tokens: (B, T/t, C) -> (B, T, C)" if name ==
            "gather" else "the reduce-scatter returns this rank's rows: (B, T, C) -> "
            "(B, T/t, C)")
    if not isinstance(y, torch.Tensor) or tuple(y.shape) != want:
        return {"y": cpu(y), "grad": None, "forward": fwd, "backward": [], "changed": changed}
    bwd = backward(f"{name}(x)", y, up.to(dev), rank, what, shape_hint=SEQ_DIM, rename=KIND)
    return {"y": cpu(y), "grad": cpu(x.grad), "forward": fwd, "backward": bwd,
            "changed": changed}


def _pair_worker(gather: Callable, reduce_scatter: Callable) -> dict:
    rank, t, dev = env()
    guard()
    shard, weighted = _tags(rank, t)
    out: dict[str, Any] = {}
    for name, op, x0, up in (("gather", gather, shard, weighted),
                             ("reduce_scatter", reduce_scatter, weighted, shard)):
        try:
            out[name] = _pair_one(name, op, x0, up, rank, t, dev)
        except CheckFailed as exc:  # reported by the parent in the order it checks things
            out[name] = {"error": str(exc)}
    return out


def _pair_stories(name: str, part: str, rank: int, t: int) -> list[tuple[Any, str]]:
    shards = [_tags(q, t)[0] for q in range(t)]
    s = torch.cat(shards, dim=1)  # (B, T, C): positions
    weighted = _tags(rank, t)[1]
    total = t * (t + 1) / 2 * (s + 1)
    mixed = torch.cat(shards, dim=0).reshape(s.shape)
    others = [(rows(total, q, t), f"it holds rank {q}'s rows: rank r keeps rows "
               f"r*T/t:(r+1)*T/t") for q in range(t) if q != rank]
    return {
        ("gather", "forward"): [(mixed, INTO_TENSOR), (rows(s, rank, t), "the forward returned "
                                "this rank's shard: the all-gather must return all T tokens")],
        ("gather", "backward"): [
            (rows(weighted, rank, t), "the backward kept this rank's rows of the gradient "
             "without summing over ranks: " + GATHER_BACKWARD),
            (total, "the backward returned the summed gradient of all T tokens (an all-reduce) "
             "instead of this rank's rows: " + GATHER_BACKWARD),
            (weighted, "the backward returned the upstream gradient unchanged: "
             + GATHER_BACKWARD)] + others,
        ("reduce_scatter", "forward"): [
            (total, "the forward summed but kept all T tokens (an all-reduce): " + RS_FORWARD),
            (rows(weighted, rank, t), "the forward kept this rank's rows without summing "
             "over ranks: " + RS_FORWARD), (weighted, "the forward returned its input: "
             + RS_FORWARD)] + others,
        ("reduce_scatter", "backward"): [
            (mixed, INTO_TENSOR), (t * s, "the backward summed the gathered gradients over "
                                   "ranks: gathering is enough. " + RS_BACKWARD),
            (rows(s, rank, t), "the backward returned this rank's rows only: "
             + RS_BACKWARD)],
    }[(name, part)]


def _check_rank(res: dict, rank: int, t: int) -> None:
    s1 = t * (t + 1) / 2
    s = torch.cat([_tags(q, t)[0] for q in range(t)], dim=1)
    want = {("gather", "forward"): s, ("gather", "backward"): rows(s1 * (s + 1), rank, t),
            ("reduce_scatter", "forward"): rows(s1 * (s + 1), rank, t),
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
        hint = story(got, _pair_stories(name, part, rank, t))
        if hint is None and got.shape != expected.shape:
            hint = SEQ_DIM
        assert_close(got, expected, name=label, rank=rank, **EXACT, hint=hint)
    for name in ("gather", "reduce_scatter"):
        if res[name]["changed"]:
            fail(f"your code modified its input x (the tensor given to {name}) in place",
                 rank=rank, hint="communicate copies (x.clone(), or new tensors): the "
                                 "caller's tensor must not change")


@exercise(KEY_PAIR)
def check_sp_pair(gather: Callable, reduce_scatter: Callable, *, world_size: int = 2,
                  timeout: float = CHECK_TIMEOUT_S, quiet: bool = False) -> None:
    """gather: forward all-gather, backward reduce-scatter; reduce_scatter: forward
    reduce-scatter, backward all-gather; along dim 1 of (B, T, C), exactly (see above)."""
    reject_reference(gather, "gather")
    reject_reference(reduce_scatter, "reduce_scatter")
    t = world_size
    results = run_checked(_pair_worker, t, gather, reduce_scatter, timeout=timeout,
                          what="the sequence-parallel pair", hang_hint=HANG)
    for rank, res in enumerate(results):
        _check_rank(res, rank, t)
    for name, fwd, bwd in (("gather", "all_gather", "reduce_scatter"),
                           ("reduce_scatter", "reduce_scatter", "all_gather")):
        sub = [r[name] for r in results]
        expect_kinds(sub, "forward", name, [fwd], f"{name}'s forward is one {fwd}")
        expect_kinds(sub, "backward", name, [bwd], GATHER_BACKWARD if name == "gather"
                     else RS_BACKWARD)
    if not quiet:
        s1 = t * (t + 1) / 2
        print(f"gather and reduce_scatter OK on {t} ranks: forward and backward exact, one "
              f"collective each way; the gather's backward sums to t(t+1)/2 (s+1) = {s1:g} (s+1)")
