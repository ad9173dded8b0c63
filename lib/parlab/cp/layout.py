r"""Which tokens each rank holds, how much causal work that gives it, and when the ring hides.

Layouts of a sequence of T tokens over W ranks, n = T/W tokens each:

- contiguous: rank r holds positions $[rn, (r+1)n)$;
- striped: rank r holds $r, r+W, r+2W, \dots$ (every W-th token);
- zigzag: cut the sequence into 2W chunks of $m = T/2W$; rank r holds chunks r and
  $2W-1-r$, one early and one late.

Causal work. Query i sees keys $0..i$, i+1 score entries, so rank r computes
$w_r = \sum_{i \in P_r} (i+1)$ entries. Contiguous: $w_r = rn^2 + \frac{n(n+1)}{2}$, a spread
of $(W-1)n^2$ between the first and last rank. Striped: $w_r = n(r+1) + W\frac{n(n-1)}{2}$,
a spread of $n(W-1)$, less than one $n \times n$ block when $n > W-1$. Zigzag:
$w_r = (2W-1)m^2 + m(m+1)$ for every r: no spread at all.

In the ring, rank r meets block $(r-s) \bmod W$ at step s; `step_work` gives the entries of
every (rank, step) pair, and the ring's pace is about $\sum_s \max_r$ of them.

When the ring hides its communication. Per step a rank computes $4Hn^2D$ FLOPs of its
$n \times n$ block ($QK^\top$ and $PV$, per batch element) and ships K and V,
$2HnD\,d$ bytes (d bytes per element). Compute covers the transfer when
$\frac{4Hn^2D}{F} \ge \frac{2HnD\,d}{\beta} \iff n \ge \frac{F\,d}{2\beta}$: a block length
that depends only on the device's FLOP/s F, the link's bytes/s β and the dtype.
"""

from __future__ import annotations

import torch
from torch import Tensor

__all__ = ["LAYOUTS", "layout_positions", "position_table", "causal_work", "step_work",
           "ring_pace", "block_flops", "block_backward_flops", "block_bytes",
           "min_hiding_block"]

LAYOUTS = ("contiguous", "striped", "zigzag")


def _sizes(world_size: int, seq_len: int, layout: str) -> int:
    if layout not in LAYOUTS:
        raise ValueError(f"layout must be one of {', '.join(LAYOUTS)}, got {layout!r}")
    parts = 2 * world_size if layout == "zigzag" else world_size
    if world_size < 1 or seq_len < 1 or seq_len % parts:
        raise ValueError(f"the {layout} layout needs seq_len divisible by {parts} "
                         f"({'2W' if layout == 'zigzag' else 'W'}), got seq_len={seq_len} "
                         f"for W={world_size}")
    return seq_len // world_size


def layout_positions(layout: str, rank: int, world_size: int, seq_len: int) -> Tensor:
    """Global positions (n,) int64, ascending, that `rank` holds under `layout`."""
    n = _sizes(world_size, seq_len, layout)
    if layout == "contiguous":
        return torch.arange(rank * n, (rank + 1) * n)
    if layout == "striped":
        return torch.arange(rank, seq_len, world_size)
    m = n // 2  # zigzag: chunks r and 2W-1-r of m tokens
    late = 2 * world_size - 1 - rank
    return torch.cat([torch.arange(rank * m, (rank + 1) * m), torch.arange(late * m,
                                                                           (late + 1) * m)])


def position_table(layout: str, world_size: int, seq_len: int) -> Tensor:
    """(W, n) int64: row r is `layout_positions(layout, r, W, seq_len)`."""
    return torch.stack([layout_positions(layout, r, world_size, seq_len)
                        for r in range(world_size)])


def _visible(queries: Tensor, keys: Tensor) -> int:
    """#{(i, j): i in queries, j in keys, j <= i}, without forming the n x n mask."""
    ordered = torch.sort(keys.flatten()).values
    return int(torch.searchsorted(ordered, queries.flatten(), right=True).sum())


def causal_work(table: Tensor) -> list[int]:
    """Unmasked causal score entries per rank (per batch element and head): sum of (i + 1)."""
    return [int((row + 1).sum()) for row in table]


def step_work(table: Tensor, *, causal: bool = True) -> Tensor:
    """(W, W) int64: entry [r, s] = score entries rank r computes at ring step s, against the
    block of rank (r - s) mod W."""
    world, n = table.shape
    out = torch.zeros(world, world, dtype=torch.int64)
    for r in range(world):
        for s in range(world):
            src = (r - s) % world
            out[r, s] = _visible(table[r], table[src]) if causal else n * n
    return out


def ring_pace(work: Tensor) -> int:
    """About how long the ring takes, in score entries: every step waits for its slowest rank,
    sum over steps of the max over ranks. Compare with the ideal, total / W."""
    return int(work.max(dim=0).values.sum())


def block_flops(n: int, head_dim: int, heads: int = 1) -> float:
    """Forward FLOPs of one n x n block, per batch element: QK^T and PV, 2 n^2 D each."""
    return 4.0 * heads * n * n * head_dim


def block_backward_flops(n: int, head_dim: int, heads: int = 1) -> float:
    """Backward FLOPs of one n x n block, per batch element: five products of 2 n^2 D each,
    the scores S = QK^T recomputed, dV = P^T dO, dP = dO V^T, dQ = dS K and dK = dS^T Q
    (the elementwise softmax terms left out): 2.5 times the forward's two."""
    return 10.0 * heads * n * n * head_dim


def block_bytes(n: int, head_dim: int, heads: int = 1, dtype_bytes: int = 2) -> float:
    """Bytes a rank ships per ring step: its K and V blocks, 2 n D H d."""
    return 2.0 * heads * n * head_dim * dtype_bytes


def min_hiding_block(flops_per_s: float, bytes_per_s: float, dtype_bytes: int = 2, *,
                     causal_share: float = 1.0) -> float:
    r"""Smallest block length n (tokens per rank) whose compute covers its transfer:
    $n \ge \frac{F d}{2\beta\,c}$, with c the share of the block's entries computed (1 for a
    full block, 1/2 for the half-masked blocks of a balanced causal layout)."""
    if flops_per_s <= 0 or bytes_per_s <= 0 or not 0 < causal_share <= 1:
        raise ValueError("flops_per_s and bytes_per_s must be > 0, causal_share in (0, 1]")
    return flops_per_s * dtype_bytes / (2.0 * bytes_per_s * causal_share)
