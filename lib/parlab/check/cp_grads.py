r"""Graded checks of module 05, exercises 3 and 4 (helpers in `parlab.check.cp_common`).

Exercise 3, `check_ring_backward(fn)`: `fn(q, k, v, out, lse, dout, pos, causal=...)` ->
(dq, dk, dv) of this rank's tokens, given its rows of the float64 reference forward, against
autograd through full softmax attention (float64, rtol 1e-10), for contiguous, striped and
zigzag positions, causal and not; point-to-point calls with neighbours only.

Exercise 4, `check_layouts(fn)`: `fn(layout, rank, world_size, seq_len)` -> the positions a
rank holds. For each of several (W, T): the ranks' positions split 0..T-1 exactly; under
"striped" and "zigzag" the per-rank counts of unmasked causal score entries,
$w_r = \sum_{i \in P_r}(i + 1)$, differ by less than one $n \times n$ block (n = T/W > W - 1),
and the positions are those of the layout asked for; parlab's reference ring attention, with
tokens placed by the learner's positions, still matches full attention (float64, 1e-10).
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor

from parlab.check import CHECK_TIMEOUT_S, assert_close, fail, not_reexport
from parlab.check.cp_common import (
    F64_TOL,
    MASK,
    SEED,
    N,
    Recorder,
    call,
    check_protocol,
    cpu,
    env,
    inputs,
    reference,
    run_ranks,
)
from parlab.cp import layout as cp_layout
from parlab.cp import ring
from parlab.cp.layout import position_table
from parlab.errors import reference_message, refused

REFERENCE_RING = (ring.ring_attention_forward, ring.ring_attention_backward)
RING_REFUSED = reference_message("parlab.cp.ring_attention_forward / backward")
TRAVEL = ("dk and dv must travel round the ring with their K/V block: at every step add your "
          "queries' terms to the accumulators of the block you hold and pass them on with it; "
          "after W hops (one more than K and V) rank r holds the accumulators of its own block")
BACKWARD_CASES = (("contiguous", False), ("contiguous", True), ("striped", True),
                  ("zigzag", True))


# --- exercise 3: the backward pass ------------------------------------------------------------

def _backward_cases(world: int) -> list[dict]:
    return [{"layout": lay, "causal": causal, "seed": SEED + 100 + i,
             "table": position_table(lay, world, world * N),
             "name": f"{lay} layout, {'causal' if causal else 'not causal'}, float64"}
            for i, (lay, causal) in enumerate(BACKWARD_CASES)]


def _backward_worker(fn: Callable, cases: list[dict]) -> list[dict]:
    rank, world, dev = env()
    results = []
    for case in cases:
        q, k, v, dout = inputs(case["seed"], world * N, count=4)
        pos = torch.arange(world * N)
        out, lse = reference(q, k, v, pos, pos, case["causal"])
        mine = case["table"][rank]
        args = [x[..., mine, :].contiguous().to(dev) for x in (q, k, v, out)]
        args += [lse[..., mine].contiguous().to(dev), dout[..., mine, :].contiguous().to(dev)]
        with refused(REFERENCE_RING, RING_REFUSED), Recorder() as rec:
            got = call("ring_attention_backward", fn, *args, case["table"],
                       causal=case["causal"])
        if not (isinstance(got, tuple) and len(got) == 3):
            fail(f"{case['name']}: ring_attention_backward returned {type(got).__name__}, "
                 "expected a tuple (dq, dk, dv)", rank=rank, hint="return dq, dk, dv")
        results.append({"grads": [cpu(g) for g in got], "events": rec.events})
    return results


def _autograd(case: dict, world: int) -> tuple[list[Tensor], list[Tensor]]:
    """(dq, dk, dv) of the whole sequence, and dk restricted to each rank's own queries."""
    q, k, v, dout = inputs(case["seed"], world * N, count=4)
    pos = torch.arange(world * N)
    leaves = [x.clone().requires_grad_() for x in (q, k, v)]
    out, _ = reference(*leaves, pos, pos, case["causal"])
    (out * dout).sum().backward()
    own = []
    for r in range(world):
        mine = case["table"][r]
        kk = k.clone().requires_grad_()
        o, _ = reference(q, kk, v, pos, pos, case["causal"])
        (o[..., mine, :] * dout[..., mine, :]).sum().backward()
        own.append(kk.grad[..., mine, :])
    return [x.grad for x in leaves], own


def _backward_hint(name: str, got: Tensor, grads: list[Tensor], own: list[Tensor],
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


def check_ring_backward(fn: Callable, *, world_size: int = 2, timeout: float = CHECK_TIMEOUT_S,
                        quiet: bool = False) -> None:
    """Ring attention backward on `world_size` ranks: see the module docstring."""
    not_reexport(fn, name="ring_attention_backward")
    world, cases = world_size, _backward_cases(world_size)
    results = run_ranks(_backward_worker, world, fn, cases, what="ring_attention_backward",
                        timeout=timeout)
    for rank in range(world):
        for case, res in zip(cases, results[rank], strict=True):
            check_protocol(res["events"], rank, world, "ring_attention_backward", case["name"])
    plain_ok = False
    for i, case in enumerate(cases):
        grads, own = _autograd(case, world)
        for rank in range(world):
            mine = case["table"][rank]
            for name, got, full in zip(("dq", "dk", "dv"), results[rank][i]["grads"], grads,
                                       strict=True):
                want = full[..., mine, :]
                hint = _backward_hint(name, got, grads, own, case["table"], rank,
                                      case["causal"], plain_ok)
                assert_close(got, want, name=f"{case['name']}: {name}", rank=rank, hint=hint,
                             **F64_TOL)
        plain_ok = plain_ok or not case["causal"]
    if not quiet:
        print(f"ring_attention_backward OK on {world} ranks: dq, dk and dv match autograd "
              f"through full attention in {len(cases)} cases (float64, rtol 1e-10); "
              "isend/irecv with neighbours only")


# --- exercise 4: layouts ------------------------------------------------------------------------

SIZES = ((2, 8), (3, 24), (4, 32), (8, 128))  # (W, T), n = T / W > W - 1 and 2W divides T


def _expected(layout: str, rank: int, world: int, seq: int) -> list[int]:
    n = seq // world
    if layout == "striped":
        return list(range(rank, seq, world))
    m = n // 2
    return list(range(rank * m, (rank + 1) * m)) + list(range((2 * world - 1 - rank) * m,
                                                               (2 * world - rank) * m))


def _table(fn: Callable, layout: str, world: int, seq: int) -> Tensor:
    rows = []
    for rank in range(world):
        got = call(f"layout_positions({layout!r}, {rank}, {world}, {seq})", fn, layout, rank,
                   world, seq)
        try:
            row = torch.as_tensor(got)
        except (TypeError, ValueError, RuntimeError):
            row = None
        n = seq // world
        if row is None or row.dim() != 1 or row.numel() != n or row.is_floating_point():
            fail(f"layout_positions({layout!r}, {rank}, {world}, {seq}) returned {got!r:.80}, "
                 f"expected {n} integer positions", hint="return a 1-D integer tensor of the "
                 "n = T / W positions this rank holds (torch.arange(...), torch.cat([...]))")
        rows.append(row.long())
    return torch.stack(rows)


def _check_layout(layout: str, table: Tensor, world: int, seq: int) -> None:
    flat = sorted(table.flatten().tolist())
    call_text = f"{layout} with W={world}, T={seq}"
    if flat != list(range(seq)):
        seen = torch.bincount(table.flatten().clamp(0, seq), minlength=seq + 1)[:seq]
        twice = [i for i in range(seq) if seen[i] > 1][:5]
        missing = [i for i in range(seq) if seen[i] == 0][:5]
        fail(f"{call_text}: the ranks' positions do not split 0..{seq - 1}: "
             f"held twice {twice}, held by nobody {missing}",
             hint="every token must live on exactly one rank")
    if layout == "contiguous":
        return
    n = seq // world
    work = [int((row + 1).sum()) for row in table]  # query i sees keys 0..i
    spread = max(work) - min(work)
    if spread >= n * n:
        fail(f"{call_text}: causal score entries per rank {work}, a spread of {spread:,}, at "
             f"least one whole n x n block ({n * n:,}); a balanced layout spreads less",
             hint=("striped: rank r holds r, r + W, r + 2W, ..." if layout == "striped" else
                   "zigzag: cut the sequence into 2W chunks of T / 2W; rank r holds chunk r "
                   "and chunk 2W - 1 - r, one early and one late"))
    for rank in range(world):
        want = _expected(layout, rank, world, seq)
        if sorted(table[rank].tolist()) != want:
            fail(f"{call_text}: rank {rank} holds {sorted(table[rank].tolist())}, balanced but "
                 f"not the {layout} layout, which puts {want} there",
                 hint="striped: r, r + W, ...; zigzag: chunks r and 2W - 1 - r of 2W")


def _layout_ring_worker(tables: dict[str, Tensor], seed: int) -> dict[str, float]:
    from parlab.cp.ring import ring_attention_forward

    rank, world, dev = env()
    q, k, v = inputs(seed, tables["striped"].numel())
    pos = torch.arange(q.shape[-2])
    full, _ = reference(q, k, v, pos, pos, True)
    errors = {}
    for layout, table in tables.items():
        mine = table[rank]
        out, _ = ring_attention_forward(*(x[..., mine, :].to(dev) for x in (q, k, v)), table,
                                        causal=True)
        errors[layout] = float((out.cpu() - full[..., mine, :]).abs().max())
    return errors


def check_layouts(fn: Callable, *, world_size: int = 2, timeout: float = CHECK_TIMEOUT_S,
                  quiet: bool = False) -> dict[str, list[int]]:
    """layout_positions(layout, rank, W, T): see the module docstring. Runs the ring on
    `world_size` ranks; returns the per-rank work of each layout at W = 4, T = 32."""
    not_reexport(fn, name="layout_positions")
    with refused([cp_layout.layout_positions],
                 reference_message("parlab.cp.layout_positions")):
        for world, seq in SIZES:
            for layout in ("contiguous", "striped", "zigzag"):
                _check_layout(layout, _table(fn, layout, world, seq), world, seq)
        seq = world_size * 2 * N
        tables = {lay: _table(fn, lay, world_size, seq) for lay in ("striped", "zigzag")}
        shown = {lay: [int((row + 1).sum()) for row in _table(fn, lay, 4, 32)]
                 for lay in ("contiguous", "striped", "zigzag")}
    errors = run_ranks(_layout_ring_worker, world_size, tables, SEED + 7,
                       what="parlab's ring attention under your layouts", timeout=timeout)
    for rank, errs in enumerate(errors):
        for layout, err in errs.items():
            assert_close(torch.tensor(err), torch.tensor(0.0), rank=rank, atol=1e-10, rtol=0,
                         name=f"{layout} layout, W={world_size}: largest |ring - full "
                         "attention|", hint="the positions must be global token indices")
    if not quiet:
        print(f"layout_positions OK for (W, T) in {list(SIZES)}: each layout splits the "
              f"sequence; striped and zigzag balance the causal work; the ring on {world_size} "
              f"ranks matches full attention under both. Work per rank at W = 4, T = 32: "
              + "; ".join(f"{k} {v}" for k, v in shown.items()))
    return shown
