r"""Exercise 2 of module 05, `check_ring_forward(ring_attention)`: ring attention, forward.

`fn(q, k, v, pos, causal=...)` -> (out, lse) on every rank, for contiguous, striped and
zigzag positions, non-causal then causal (float64, 1e-10), then causal with large logits in
float32 (1e-4), with N = 6 tokens per rank. The learner's ring uses the learner's merge from
exercise 1, so a failure there is named first (`exercise(needs=...)`). Watched from outside
(`parlab.check.cp.ranks.Recorder`): only isend/irecv (or send/recv), each to the right
neighbour with K's dtype and one to four blocks' worth of elements (K alone, or blocks packed
together), each send as large as the receive at the same place in the rank's order, checked
before the call is made; q, k, v and pos unchanged
after the call; and the overlap: every compute phase but the last must run while a receive
is in flight. parlab's ring functions are refused while the learner's ring runs.

A right answer must not depend on W (the visible test runs 2 and 3 ranks: on 2 both
neighbours are one rank; the hidden one 4), on which positions a rank holds (three layouts),
on the mask (causal and not), the dtype, or the sizes: the last case has batch 2, 3 heads of
6 and 4 tokens per rank instead of 1, 2 heads of 8 and 6, so a buffer of a written-in shape
fails there (parlab.check.cp.common).
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor

from parlab.check._compare import assert_close, fail
from parlab.check._harness import CHECK_TIMEOUT_S, exercise, not_reexport, run_checked
from parlab.check.cp.common import (
    DEADLOCK,
    F64_TOL,
    LARGE_TOL,
    MASK,
    OTHER_DIMS,
    OTHER_N,
    OVERLAP,
    SEED,
    B,
    D,
    H,
    N,
    RingCase,
    inputs,
    lse_story,
    reference,
)
from parlab.check.cp.ranks import call_ring, check_protocol, cpu, env, overlap
from parlab.cp.blocks import block_attention, empty_partial, merge_partials
from parlab.cp.layout import LAYOUTS, position_table

__all__ = ["check_ring_forward", "ring_cases", "HANG"]

HANG = DEADLOCK  # a receive from the wrong neighbour is stopped before it is made (Recorder)


def ring_cases(world: int, *, backward: bool = False) -> list[RingCase]:
    """The ring checks' cases on `world` ranks (module docstrings of forward and backward):
    N tokens per rank of (B, H, D), and last a zigzag causal case of other sizes."""
    if backward:
        specs = [(lay, c, torch.float64, 1.0, F64_TOL) for lay, c in
                 (("contiguous", False), ("contiguous", True), ("striped", True),
                  ("zigzag", True))]
    else:
        specs = [(lay, c, torch.float64, 1.0, F64_TOL) for c in (False, True) for lay in LAYOUTS]
        specs.append(("contiguous", True, torch.float32, 60.0, LARGE_TOL))
    specs.append(("zigzag", True, torch.float64, 1.0, F64_TOL))  # other sizes (below)
    cases = []
    for i, (lay, causal, dtype, scale, tol) in enumerate(specs):
        other = i == len(specs) - 1
        dims, n = (OTHER_DIMS, OTHER_N) if other else ((B, H, D), N)
        name = (f"{lay} layout, {'causal' if causal else 'not causal'}, "
                f"{str(dtype).replace('torch.', '')}"
                + (" with large scores (lse up to ~200)" if scale > 1 else "")
                + (f", other sizes (batch {dims[0]}, {dims[1]} heads of {dims[2]}, {n} tokens "
                   "per rank)" if other else ""))
        cases.append(RingCase(name, lay, causal, dtype, scale, (tol["rtol"], tol["atol"]),
                              position_table(lay, world, world * n),
                              SEED + 100 * backward + i, dims))
    return cases


def _forward_worker(fn: Callable, cases: list[RingCase]) -> list[dict]:
    rank, world, dev = env()
    results = []
    for case in cases:
        q, k, v = inputs(case.seed, case.seq, case.dtype, case.scale, dims=case.dims)
        mine = case.table[rank]
        args = [x[..., mine, :].contiguous().to(dev) for x in (q, k, v)]
        got, events = call_ring(fn, case, args, ("q", "k", "v"), what="ring_attention",
                                returns=("out", "lse"), rank=rank)
        results.append({"out": cpu(got[0]), "lse": cpu(got[1]), "events": events})
    return results


def _wrong_mask(q: Tensor, k: Tensor, v: Tensor, table: Tensor, rank: int) -> dict[str, Tensor]:
    """This rank's output under the likely wrong masks (for the message)."""
    world = table.shape[0]
    local = torch.arange(table.shape[1])
    variants = {
        "your queries' positions pos[r] for every block's keys":
            lambda s, src: (table[rank], table[rank], True),
        "the positions of rank (r + s) % W, the wrong direction round the ring":
            lambda s, src: (table[rank], table[(rank + s) % world], True),
        "a local triangular mask (tril) on every block":
            lambda s, src: (local, local, True),
        "a mask on the diagonal block only": lambda s, src: (table[rank], table[src], s == 0),
    }
    mine = table[rank]
    out = {}
    for text, pick in variants.items():
        acc = empty_partial(q[..., mine, :])
        for s in range(world):
            src = (rank - s) % world
            qp, kp, causal = pick(s, src)
            part = block_attention(q[..., mine, :], k[..., table[src], :], v[..., table[src], :],
                                   qp, kp, causal=causal)
            acc = merge_partials(*acc, *part)
        out[text] = acc[0]
    return out


def _shapes(got: dict, want_out: Tensor, want_lse: Tensor, case: RingCase, rank: int) -> None:
    for name, x, want in (("out", got["out"], want_out), ("lse", got["lse"], want_lse)):
        if not isinstance(x, Tensor) or x.shape != want.shape:
            fail(f"{case.name}: {name} should be a tensor of shape {tuple(want.shape)}, got "
                 f"{tuple(x.shape) if isinstance(x, Tensor) else type(x).__name__}",
                 rank=rank, hint="out (B, H, n, D) and lse (B, H, n) of this rank's n tokens")


def _values(results: list, cases: list[RingCase], world: int) -> None:
    passed_plain = set()
    for i, case in enumerate(cases):
        q, k, v = inputs(case.seed, case.seq, case.dtype, case.scale, dims=case.dims)
        pos = torch.arange(case.seq)
        want_out, want_lse = reference(q, k, v, pos, pos, case.causal)
        for rank in range(world):
            got, mine = results[rank][i], case.table[rank]
            w_out, w_lse = want_out[..., mine, :], want_lse[..., mine]
            _shapes(got, w_out, w_lse, case, rank)
            if all(torch.allclose(x.double(), w, rtol=case.tol[0], atol=case.tol[1])
                   for x, w in ((got["out"], w_out), (got["lse"], w_lse))):
                continue
            hint = lse_story(got["out"], got["lse"], w_lse)
            if hint is None and case.causal and case.layout in passed_plain:
                hint = MASK
                for text, alt in _wrong_mask(q.double(), k.double(), v.double(), case.table,
                                             rank).items():
                    if torch.allclose(got["out"].double(), alt, rtol=1e-6, atol=1e-8):
                        hint = f"your output is what {text} gives: {MASK}"
                        break
            for name, x, want in (("lse", got["lse"], w_lse), ("out", got["out"], w_out)):
                assert_close(x, want, name=f"{case.name}: {name}", rank=rank, hint=hint,
                             **case.tolerance)
        if not case.causal:
            passed_plain.add(case.layout)


@exercise("05.ring_forward", needs={"05.merge": "merge (exercise 1)"})
def check_ring_forward(fn: Callable, *, world_size: int = 2, timeout: float = CHECK_TIMEOUT_S,
                       quiet: bool = False) -> None:
    """Ring attention forward on `world_size` ranks: see the module docstring."""
    not_reexport(fn, name="ring_attention")
    world, cases = world_size, ring_cases(world_size)
    results = run_checked(_forward_worker, world, fn, cases, what="ring_attention",
                          timeout=timeout, hang_hint=HANG)
    for rank in range(world):
        for case, res in zip(cases, results[rank], strict=True):
            check_protocol(res["events"], rank, world, "ring_attention", case.name)
    _values(results, cases, world)
    for rank in range(world):
        for case, res in zip(cases, results[rank], strict=True):
            idle, computed = overlap(res["events"])
            if world > 1 and idle > 1:
                fail(f"{case.name}: {idle} of the {computed} compute phases (matrix products "
                     "between two communication calls) ran with no transfer in flight; only "
                     "the last step has nothing left to receive", rank=rank, hint=OVERLAP)
    if not quiet:
        print(f"ring_attention OK on {world} ranks ({world * N} tokens): {len(cases)} cases "
              "(contiguous, striped and zigzag; causal and not; float64 to 1e-10, float32 "
              "with large scores to 1e-4); isend/irecv with neighbours only; each block "
              "computed while the next one flew; inputs left unchanged")
