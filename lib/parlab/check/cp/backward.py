r"""Exercise 3 of module 05, `check_ring_backward(ring_attention_backward)`.

`fn(q, k, v, out, lse, dout, pos, causal=...)` -> (dq, dk, dv) of this rank's tokens, given
its rows of the float64 reference forward, against autograd through full softmax attention
(float64, rtol 1e-10), for contiguous, striped and zigzag positions, causal and not, with
N = 6 tokens per rank. It stands on its own: the forward's out and lse are the reference's,
and the block gradients come from the given `block_attention_backward`. Point-to-point calls
only, each to the right neighbour with K's dtype and one to four blocks (a block travels with
its accumulators in one message or in several; `Recorder`, before the call is made);
every input unchanged after the call; parlab's ring functions refused while it runs.

A right answer must not depend on W (2 and 3 visible, 4 hidden), the layout, the mask, the
upstream gradient (dout is random, not ones) or the sizes (the last case has batch 2, 3 heads
of 6 and 4 tokens per rank, as in the forward check).
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor

from parlab.check._compare import assert_close
from parlab.check._harness import CHECK_TIMEOUT_S, exercise, not_reexport, run_checked
from parlab.check.cp.common import F64_TOL, MASK, N, RingCase, inputs, reference
from parlab.check.cp.forward import HANG, ring_cases
from parlab.check.cp.ranks import call_ring, check_protocol, cpu, env

__all__ = ["check_ring_backward"]

TRAVEL = ("dk and dv must travel round the ring with their K/V block: at every step add your "
          "queries' terms to the accumulators of the block you hold and pass them on with it; "
          "after W hops (one more than K and V) rank r holds the accumulators of its own block")
NAMES = ("q", "k", "v", "out", "lse", "dout")


def _backward_worker(fn: Callable, cases: list[RingCase]) -> list[dict]:
    rank, world, dev = env()
    results = []
    for case in cases:
        q, k, v, dout = inputs(case.seed, case.seq, count=4, dims=case.dims)
        pos = torch.arange(case.seq)
        out, lse = reference(q, k, v, pos, pos, case.causal)
        mine = case.table[rank]
        args = [x[..., mine, :].contiguous().to(dev) for x in (q, k, v, out)]
        args += [lse[..., mine].contiguous().to(dev), dout[..., mine, :].contiguous().to(dev)]
        got, events = call_ring(fn, case, args, NAMES, what="ring_attention_backward",
                                returns=("dq", "dk", "dv"), rank=rank)
        results.append({"grads": [cpu(g) for g in got], "events": events})
    return results


def _autograd(case: RingCase, world: int) -> tuple[list[Tensor], list[Tensor]]:
    """(dq, dk, dv) of the whole sequence, and dk restricted to each rank's own queries."""
    q, k, v, dout = inputs(case.seed, case.seq, count=4, dims=case.dims)
    pos = torch.arange(case.seq)
    leaves = [x.clone().requires_grad_() for x in (q, k, v)]
    out, _ = reference(leaves[0], leaves[1], leaves[2], pos, pos, case.causal)
    (out * dout).sum().backward()
    own = []
    for r in range(world):
        mine = case.table[r]
        kk = k.clone().requires_grad_()
        o, _ = reference(q, kk, v, pos, pos, case.causal)
        (o[..., mine, :] * dout[..., mine, :]).sum().backward()
        assert kk.grad is not None
        own.append(kk.grad[..., mine, :])
    grads = [x.grad for x in leaves]
    return [g for g in grads if g is not None], own


def _backward_hint(name: str, got: object, grads: list[Tensor], own: list[Tensor],
                   table: Tensor, rank: int, causal: bool, plain_ok: bool) -> str | None:
    world = table.shape[0]

    def close(a: object, b: Tensor) -> bool:
        return (isinstance(a, Tensor) and a.shape == b.shape
                and bool(torch.allclose(a.double(), b, rtol=1e-6, atol=1e-9)))

    if name in ("dk", "dv"):
        full = grads[1 if name == "dk" else 2]
        for other in ((rank + 1) % world, (rank - 1) % world):
            if other != rank and close(got, full[..., table[other], :]):
                off = "short" if other == (rank - 1) % world else "too far"
                return (f"your {name} is the gradient of rank {other}'s block: the "
                        f"accumulators stopped one hop {off}. " + TRAVEL)
        if name == "dk" and close(got, own[rank]):
            return "your dk holds only your own queries' terms. " + TRAVEL
    if causal and plain_ok:
        return MASK
    return TRAVEL if name in ("dk", "dv") else None


@exercise("05.ring_backward")
def check_ring_backward(fn: Callable, *, world_size: int = 2, timeout: float = CHECK_TIMEOUT_S,
                        quiet: bool = False) -> None:
    """Ring attention backward on `world_size` ranks: see the module docstring."""
    not_reexport(fn, name="ring_attention_backward")
    world, cases = world_size, ring_cases(world_size, backward=True)
    results = run_checked(_backward_worker, world, fn, cases, what="ring_attention_backward",
                          timeout=timeout, hang_hint=HANG)
    for rank in range(world):
        for case, res in zip(cases, results[rank], strict=True):
            check_protocol(res["events"], rank, world, "ring_attention_backward", case.name)
    plain_ok = False
    for i, case in enumerate(cases):
        grads, own = _autograd(case, world)
        for rank in range(world):
            mine = case.table[rank]
            for name, got, full in zip(("dq", "dk", "dv"), results[rank][i]["grads"], grads,
                                       strict=True):
                hint = _backward_hint(name, got, grads, own, case.table, rank, case.causal,
                                      plain_ok)
                assert_close(got, full[..., mine, :], name=f"{case.name}: {name}", rank=rank,
                             hint=hint, **F64_TOL)
        plain_ok = plain_ok or not case.causal
    if not quiet:
        print(f"ring_attention_backward OK on {world} ranks ({world * N} tokens): dq, dk and "
              f"dv match autograd through full attention in {len(cases)} cases (float64, rtol "
              "1e-10); isend/irecv with neighbours only; inputs left unchanged")
