r"""Exercise 4 of module 05, `check_layouts(layout_positions)`: striped and zigzag layouts.

`fn(layout, rank, world_size, seq_len)` -> the positions a rank holds. For each of several
(W, T), most of them not powers of two: the ranks' positions split 0..T-1 exactly; under
"striped" and "zigzag" the per-rank counts of unmasked causal score entries,
$w_r = \sum_{i \in P_r}(i + 1)$, differ by less than one $n \times n$ block (n = T/W > W - 1),
and the positions are those of the layout asked for; parlab's reference ring attention, with
tokens placed by the learner's positions, still matches full attention (float64, 1e-10).
It stands on its own (the ring is parlab's). parlab's `layout_positions` is refused while the
learner's function runs.

A right answer must not depend on W or T: the visible closed forms run W = 2, 3, 4, 5, 8 with
6 to 16 tokens per rank (a zigzag chunk of 3 to 8), every rank of each; the runs on ranks (2
visible, 3 and 4 hidden) only confirm that the positions place tokens for the ring.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor

from parlab.check._compare import assert_close, fail
from parlab.check._harness import CHECK_TIMEOUT_S, call_learner, exercise, not_reexport, run_checked
from parlab.check.cp.common import SEED, N, inputs, reference
from parlab.check.cp.ranks import env
from parlab.cp import layout as cp_layout

__all__ = ["check_layouts", "SIZES"]

SIZES = ((2, 12), (3, 18), (4, 40), (5, 30), (8, 128))  # (W, T): n = T/W > W - 1, 2W | T
SHOWN = (4, 32)  # the work per rank returned for the notebook's table


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
        where = f"layout_positions({layout!r}, {rank}, {world}, {seq})"
        got = call_learner(where, fn, layout, rank, world, seq,
                           refuse=[cp_layout.layout_positions],
                           refusal="parlab.cp.layout_positions")
        try:
            row = torch.as_tensor(got)
        except (TypeError, ValueError, RuntimeError):
            row = None
        n = seq // world
        if row is None or row.dim() != 1 or row.numel() != n or row.is_floating_point():
            fail(f"{where} returned {got!r:.80}, expected {n} integer positions",
                 hint="return a 1-D integer tensor of the n = T / W positions this rank holds "
                      "(torch.arange(...), torch.cat([...]))")
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
        out, _ = ring_attention_forward(q[..., mine, :].to(dev), k[..., mine, :].to(dev),
                                        v[..., mine, :].to(dev), table, causal=True)
        errors[layout] = float((out.cpu() - full[..., mine, :]).abs().max())
    return errors


@exercise("05.layouts")
def check_layouts(fn: Callable, *, world_size: int = 2, timeout: float = CHECK_TIMEOUT_S,
                  quiet: bool = False) -> dict[str, list[int]]:
    """layout_positions(layout, rank, W, T): see the module docstring. Runs the ring on
    `world_size` ranks; returns the per-rank work of each layout at W = 4, T = 32."""
    not_reexport(fn, name="layout_positions")
    for world, seq in SIZES:
        for layout in ("contiguous", "striped", "zigzag"):
            _check_layout(layout, _table(fn, layout, world, seq), world, seq)
    seq = world_size * 2 * N
    tables = {lay: _table(fn, lay, world_size, seq) for lay in ("striped", "zigzag")}
    shown = {lay: [int((row + 1).sum()) for row in _table(fn, lay, *SHOWN)]
             for lay in ("contiguous", "striped", "zigzag")}
    errors = run_checked(_layout_ring_worker, world_size, tables, SEED + 7,
                         what="parlab's ring attention under your layouts", timeout=timeout,
                         hang_hint="parlab's ring does not hang by itself: a position table "
                                   "of an unexpected shape? Each rank returns n = T / W "
                                   "positions")
    for rank, errs in enumerate(errors):
        for layout, err in errs.items():
            assert_close(torch.tensor(err), torch.tensor(0.0), rank=rank, atol=1e-10, rtol=0,
                         name=f"{layout} layout, W={world_size}, T={seq}: largest |ring - full "
                         "attention|", hint="the positions must be global token indices")
    if not quiet:
        print(f"layout_positions OK for (W, T) in {list(SIZES)}: each layout splits the "
              f"sequence; striped and zigzag balance the causal work; the ring on {world_size} "
              f"ranks matches full attention under both. Work per rank at W = {SHOWN[0]}, "
              f"T = {SHOWN[1]}: " + "; ".join(f"{k} {v}" for k, v in shown.items()))
    return shown
