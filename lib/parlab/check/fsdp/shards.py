r"""Module 01, exercise 2 (first test): `check_flat_shards`, the three helpers of the layer.

- `take_shard(flat, rank, d)`, in the kernel: elements $[rn, (r+1)n)$, $n = P/d$, of a random
  flat vector, as a tensor that owns its storage (a view would keep all P elements alive on
  every rank: `assert_owns_only`), with `flat` unchanged.
- `all_gather_flat(shard)`, on d ranks: the whole flat vector, from all-gathers only, sending
  $\frac{d-1}{d}\cdot 4P$ bytes (float32), `shard` unchanged.
- `reduce_scatter_flat(grad)`, on d ranks: rank r's shard of the mean of the ranks' (random)
  gradients, from reduce-scatters only, sending $\frac{d-1}{d}\cdot 4P$ bytes, `grad`
  unchanged.

Values are compared exactly for the shard and the gather (copies), to rtol=1e-5, atol=1e-6
for the mean (float32 or float64, summation order). parlab.dp.fsdp is refused while they run.
In the ranks every all-gather and reduce-scatter is watched before it reaches gloo: a buffer of
another dtype than what is sent is named (gloo's own words do not say which buffer).

A right answer does not depend on, and the tests vary: the world size (visible 2 and 3, hidden
3 and 4), P (visible 72 and 24, hidden 36 and 60), the dtype (visible float32 and float64:
buffers made with torch.empty(n) are float32 whatever the shard is), the values and which
rank holds what (random, `seed`, every rank's gradient different).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

import parlab.check._harness as harness
from parlab.check._compare import assert_owns_only, assert_unchanged, fail
from parlab.check.fsdp.common import (
    ALL_REDUCE,
    DP_WHAT,
    call,
    close,
    cpu,
    dp_references,
    env,
    kinds,
    not_fsdp,
    refuse_fsdp_in_rank,
    what,
)

__all__ = ["check_flat_shards", "OFFSET", "VIEW"]

OFFSET = ("rank r's shard is elements r*n:(r+1)*n of the flat [vec W; b], n = P/d with P = "
          "flat.numel(), never a fixed number")
VIEW = ("take_shard returned a view of flat (flat[a:b] without .clone()): a view keeps the "
        "whole flat vector alive, so every rank would still hold all P elements; return "
        "flat[a:b].clone()")
SHAPES = ("the flat vectors are 1-D: all_gather_flat (n,) -> (P,) with torch.cat of the t "
          "gathered shards, reduce_scatter_flat (P,) -> (n,) from grad.chunk(d) (each "
          ".contiguous()) and dist.reduce_scatter(out, chunks)")


DTYPE = ("make the buffers from what is sent: torch.empty_like(shard) for the gathered parts, "
         "torch.empty_like(chunk) for the reduce-scatter's output (torch.empty(n) and "
         "torch.zeros(n) are float32 whatever the shard is)")
_WATCHED = ("all_gather", "all_gather_into_tensor", "reduce_scatter", "reduce_scatter_tensor")


def _flat(numel: int, seed: int, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    return torch.randn(numel, generator=torch.Generator().manual_seed(seed)).to(dtype)


def _grad(numel: int, seed: int, rank: int, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed + 1000 + rank)
    return torch.randn(numel, generator=gen).to(dtype)


def _watch_dtypes(rank: int) -> None:
    """In a rank: every all-gather and reduce-scatter must receive into tensors of the dtype it
    sends, checked before the call (gloo refuses with "Invalid usage of tensors with different
    dtypes", which names no buffer; NCCL may not refuse at all). Wraps what parlab.comm
    installed, so the tracer still counts every call."""
    import torch.distributed as dist

    from parlab import comm

    comm.install()

    def watched(kind: str, original: Callable[..., Any]) -> Callable[..., Any]:
        def call(output: Any, input: Any, *args: Any, **kwargs: Any) -> Any:
            outs = list(output) if isinstance(output, (list, tuple)) else [output]
            ins = list(input) if isinstance(input, (list, tuple)) else [input]
            got = {t.dtype for t in outs if isinstance(t, torch.Tensor)}
            sent = {t.dtype for t in ins if isinstance(t, torch.Tensor)}
            if len(sent) == 1 and got and got != sent:
                fail(f"{kind} would receive into {', '.join(map(str, sorted(got, key=str)))} "
                     f"what is sent as {next(iter(sent))} (torch does not convert; the check "
                     "stopped the call before the exchange)", rank=rank, hint=DTYPE)
            return original(output, input, *args, **kwargs)
        return call

    for kind in _WATCHED:
        if hasattr(dist, kind):
            setattr(dist, kind, watched(kind, getattr(dist, kind)))


def shard_story(got: torch.Tensor, flat: torch.Tensor, rank: int, d: int) -> str:
    """Which wrong slice a shard of the right length is, as the start of a hint."""
    n = flat.numel() // d
    for off in range(flat.numel() - n + 1):
        if got.shape == (n,) and torch.equal(got, flat[off:off + n]):
            return f"your shard starts at element {off}; rank {rank}'s starts at {rank * n}. "
    if got.shape == (n,) and torch.equal(got, flat[rank::d]):
        return "your shard takes every d-th element (a strided shard). "
    return ""


def _check_take_shard(take_shard: Callable[..., Any], numel: int, d: int, seed: int,
                      dtype: torch.dtype) -> None:
    flat = _flat(numel, seed, dtype)
    before, n = flat.clone(), numel // d
    for rank in range(d):
        label = f"take_shard(flat of {numel} elements, rank={rank}, t={d})"
        got = call(label, take_shard, flat, rank, d, refs=dp_references(), what=DP_WHAT,
                   hint="n = flat.numel() // t; return flat[rank * n:(rank + 1) * n].clone()")
        assert_unchanged(before, flat, name=f"flat (in {label})", rank=rank)
        if not isinstance(got, torch.Tensor) or got.shape != (n,):
            fail(f"{label} returned {what(got)}, expected a tensor of shape ({n},)",
                 rank=rank, hint=f"each rank keeps n = P/t = {numel}/{d} = {n} elements: "
                 + OFFSET)
        if not torch.equal(got, before[rank * n:(rank + 1) * n]):
            fail(f"{label} holds the wrong elements", rank=rank,
                 hint=shard_story(got, before, rank, d) + OFFSET)
        assert_owns_only(got, name=label, rank=rank, hint=VIEW)


def _worker(all_gather_flat: Callable[..., Any], reduce_scatter_flat: Callable[..., Any],
            numel: int, seed: int, dtype: torch.dtype) -> dict:
    from parlab import comm

    rank, d, dev = env()
    refuse_fsdp_in_rank()
    _watch_dtypes(rank)
    n = numel // d
    shard = _flat(numel, seed, dtype)[rank * n:(rank + 1) * n].clone().to(dev)
    grad, before = _grad(numel, seed, rank, dtype).to(dev), shard.clone()
    g_before = grad.clone()
    with comm.trace() as tr:
        full = harness.call_learner("all_gather_flat(shard)", all_gather_flat, shard,
                                    shape_hint=SHAPES)
    out: dict[str, Any] = {"full": cpu(full), "gather": kinds(tr.events),
                           "shard_changed": not torch.equal(before, shard)}
    with comm.trace() as tr:
        mine = harness.call_learner("reduce_scatter_flat(grad)", reduce_scatter_flat, grad,
                                    shape_hint=SHAPES)
    out.update(mine=cpu(mine), scatter=kinds(tr.events),
               grad_changed=not torch.equal(g_before, grad))
    return out


def _expect_only(events: list, kind: str, call_name: str, rank: int, hint: str) -> None:
    got = [k for k, _ in events]
    if not got or set(got) != {kind}:
        fail(f"{call_name} made these collective calls: {got or 'none'}; expected {kind} only",
             rank=rank, hint=ALL_REDUCE if "all_reduce" in got and kind == "reduce_scatter"
             else hint)


def _check_gather(res: dict, flat: torch.Tensor, rank: int, d: int) -> None:
    _expect_only(res["gather"], "all_gather", "all_gather_flat(shard)", rank,
                 "gather every rank's shard: parts = [torch.empty_like(shard) for _ in "
                 "range(t)]; dist.all_gather(parts, shard); torch.cat(parts)")
    got, n = res["full"], flat.numel() // d
    if isinstance(got, torch.Tensor) and got.shape == (d, n):
        fail(f"all_gather_flat returned shape {tuple(got.shape)}, expected ({flat.numel()},)",
             rank=rank, hint="torch.cat(parts), not torch.stack(parts): the flat vector is 1-D")
    if not isinstance(got, torch.Tensor) or not torch.equal(got, flat):
        own = isinstance(got, torch.Tensor) and got.shape == (n,)
        fail(f"all_gather_flat(shard) returned {what(got)}, not the flat vector "
             f"({flat.numel()},) of every rank's shard in rank order", rank=rank,
             hint="you returned this rank's shard only: return torch.cat(parts)" if own else
             "dist.all_gather(parts, shard) fills parts[q] with rank q's shard: return "
             "torch.cat(parts), the parts in that order")
    if res["shard_changed"]:
        fail("all_gather_flat modified its input shard in place", rank=rank,
             hint="gather into new buffers (torch.empty_like(shard)); the shard is the "
             "parameter the optimizer updates")


def _check_scatter(res: dict, want: torch.Tensor, rank: int, d: int) -> None:
    _expect_only(res["scatter"], "reduce_scatter", "reduce_scatter_flat(grad)", rank,
                 "reduce-scatter the flat gradient: chunks = [c.contiguous() for c in "
                 "grad.chunk(t)]; dist.reduce_scatter(out, chunks); return out / t")
    got = res["mine"]
    if not close(got, want):
        hint = "rank r gets chunk r of the sum over ranks, divided by t (DDP averages)"
        if close(got, d * want):
            hint = "yours is t times the mean: the reduce-scatter sums; divide by t"
        elif isinstance(got, torch.Tensor) and got.numel() == d * want.numel():
            hint = "return this rank's shard (P/t,), not the whole gradient"
        fail(f"reduce_scatter_flat(grad) returned {what(got)}, not rank r's shard of the mean "
             "gradient over ranks", rank=rank, hint=hint)
    if res["grad_changed"]:
        fail("reduce_scatter_flat modified its input grad in place (a `grad /= t`?)",
             rank=rank, hint="divide the result, not the input: out / t")


def _check_bytes(events: list, call_name: str, want: float, rank: int, es: int) -> None:
    sent = sum(b for _, b in events)
    if abs(sent - want) > 1e-6 * want:
        fail(f"{call_name} sent {sent:,.0f} B, expected (d-1)/d * {es}P = {want:,.0f} B",
             rank=rank, hint="one collective over the whole flat vector: a ring all-gather "
             "or reduce-scatter sends (d-1)/d of it; more means extra calls")


@harness.exercise("fsdp_shards")
def check_flat_shards(take_shard: Callable[..., Any], all_gather_flat: Callable[..., Any],
                      reduce_scatter_flat: Callable[..., Any], *, world_size: int = 2,
                      numel: int = 72, seed: int = 0, dtype: torch.dtype = torch.float32,
                      timeout: float = harness.CHECK_TIMEOUT_S, quiet: bool = False) -> None:
    """The three helpers of FSDPLinear on `world_size` ranks, vectors of `numel` elements of
    `dtype` (see the module docstring)."""
    d = world_size
    if numel % d:
        raise ValueError(f"numel must be a multiple of world_size; got {numel}, {d}")
    for fn, name in ((take_shard, "take_shard"), (all_gather_flat, "all_gather_flat"),
                     (reduce_scatter_flat, "reduce_scatter_flat")):
        not_fsdp(fn, name)
    _check_take_shard(take_shard, numel, d, seed, dtype)
    results = harness.run_checked(
        _worker, d, all_gather_flat, reduce_scatter_flat, numel, seed, dtype,
        what="all_gather_flat and reduce_scatter_flat", timeout=timeout,
        hang_hint="every rank must make the same collective calls, in the same order, with "
        "tensors of the same size")
    flat, n = _flat(numel, seed, dtype), numel // d
    es = flat.element_size()
    mean = sum(_grad(numel, seed, q, dtype).double() for q in range(d)) / d
    for rank, res in enumerate(results):
        for key, name in (("full", "all_gather_flat(shard)"),
                          ("mine", "reduce_scatter_flat(grad)")):
            if isinstance(res[key], torch.Tensor) and res[key].dtype != dtype:
                fail(f"{name} returned {res[key].dtype} for a {dtype} input", rank=rank,
                     hint=DTYPE)
        _check_gather(res, flat, rank, d)
        _check_scatter(res, torch.as_tensor(mean)[rank * n:(rank + 1) * n], rank, d)
        for key, name in (("gather", "all_gather_flat(shard)"),
                          ("scatter", "reduce_scatter_flat(grad)")):
            _check_bytes(res[key], name, (d - 1) / d * numel * es, rank, es)
    if not quiet:
        print(f"take_shard, all_gather_flat and reduce_scatter_flat OK on {d} ranks "
              f"(P = {numel}, {str(dtype).replace('torch.', '')}): shards own their storage, "
              f"inputs unchanged, {(d - 1) / d * numel * es:,.0f} B per collective. Passed.")
