r"""One block of ring attention through PyTorch's fused kernel: the reference path's block.

`parlab.cp.blocks.block_attention` spells the maths out (scores, mask, log-sum-exp, weights)
and forms the whole $n_q \times n_k$ score matrix; that is the version the exercises use.
This module computes the same (out, lse) pair with PyTorch's fused CPU flash-attention kernel,
`torch.ops.aten._scaled_dot_product_flash_attention_for_cpu`, which never forms the scores,
and it returns the log-sum-exp the online-softmax merge needs, (B, H, n_q). Its backward,
`_scaled_dot_product_flash_attention_for_cpu_backward`, takes the output and log-sum-exp of
the queries' FULL attention (all key blocks) and returns this block's share of dq, dk, dv,
the same terms as `block_attention_backward`.

The fused kernel knows two masks cheaply: none, and `is_causal`, which lets query i see keys
$0..i$ (top-left aligned) and skips the tiles above the diagonal. The ring's masks come from
global positions: key j is visible from query i iff $p^k_j \le p^q_i$. With both position
lists ascending, query i sees a prefix of the keys, of length $c_i$ (non-decreasing in i), and
`plan` cuts the block into pieces the kernel computes directly:

- rows with $c_i = 0$ see no key: skipped (out 0, lse $-\infty$, no gradient);
- a run of rows with the same $c_i = c$: full attention of those rows on keys $[0, c)$;
- a run with $c_i$ rising by one per row, $c_i = c_a + (i - a)$: `is_causal` on keys
  $[c_a - 1, \dots)$, plus full attention on keys $[0, c_a - 1)$ when $c_a > 1$, merged.

The ring's three layouts need one piece per block, or two:

- contiguous: a block is full (earlier rank), causal-diagonal (own block) or skipped (later);
- striped: rank r's block against rank s's is causal with the diagonal for $s \le r$ and
  causal without it ($j < i$) for $s > r$: query row 0 sees nothing, and rows $1..n-1$
  against keys $0..n-2$ are exactly `is_causal`;
- zigzag: the own block is `is_causal` (both halves ascend together); an earlier rank's
  block is full attention on its first half of keys; a later rank's block is the second half
  of queries against all keys, the first half of queries seeing nothing.

Anything else with ascending positions that would need more than `MAX_PIECES` pieces goes
through the same kernel with an additive mask (`attn_mask`, every row it is given sees at
least one key, so the kernel's lse is right). Positions that are not ascending, and tensors
not on the CPU, fall back to the block kernel of `parlab.cp.blocks` (the CUDA kernels that
return a log-sum-exp are not wired in: this course's machines are CPUs). Inputs are computed
in float32 (float64 for float64), as the block kernel's partials are.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
from torch import Tensor

from parlab.cp.blocks import accum_dtype, block_attention, block_attention_backward

__all__ = ["Piece", "plan", "fused_attention", "fused_attention_backward", "merge_into",
           "MAX_PIECES"]

MAX_PIECES = 4  # beyond this, one masked call is cheaper than many small ones
_FORWARD = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu.default
_BACKWARD = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu_backward.default


@dataclass(frozen=True)
class Piece:
    """Queries [q0, q1) against keys [k0, k1), `is_causal` (top-left) or full."""

    q0: int
    q1: int
    k0: int
    k1: int
    causal: bool


def _ascending(pos: Tensor) -> bool:
    return bool((pos[1:] >= pos[:-1]).all()) if pos.numel() > 1 else True


def _counts(q_pos: Tensor, k_pos: Tensor) -> list[int]:
    """c_i: how many keys (a prefix, k_pos ascending) query i sees. numpy's searchsorted:
    torch's took milliseconds for 512 positions here, more than the block's attention."""
    keys, queries = k_pos.cpu().numpy(), q_pos.cpu().numpy()
    return np.searchsorted(keys, queries, side="right").tolist()


def _run_pieces(a: int, b: int, c_a: int, rising: bool, nk: int) -> list[Piece]:
    if not rising:  # every row of [a, b) sees keys [0, c_a)
        return [Piece(a, b, 0, c_a, False)]
    start = c_a - 1  # top-left causal from key `start`: row a sees keys up to c_a - 1
    end = min(nk, start + (b - a))
    head = [Piece(a, b, 0, start, False)] if start > 0 else []
    return head + [Piece(a, b, start, end, True)]


def plan(q_pos: Tensor, k_pos: Tensor, *, causal: bool) -> list[Piece] | None:
    """The pieces of one block (module docstring), or None where they cannot be cut (positions
    not ascending). An empty list: every query is masked from every key."""
    nq, nk = len(q_pos), len(k_pos)
    if not causal:
        return [Piece(0, nq, 0, nk, False)]
    if not (_ascending(q_pos) and _ascending(k_pos)):
        return None
    counts = _counts(q_pos, k_pos)
    pieces: list[Piece] = []
    a = next((i for i, c in enumerate(counts) if c > 0), nq)  # rows before a see nothing
    while a < nq:
        step = counts[a + 1] - counts[a] if a + 1 < nq else 0
        rising = step == 1
        b = a + 1
        while b < nq and counts[b] - counts[b - 1] == (1 if rising else 0):
            b += 1
        pieces += _run_pieces(a, b, counts[a], rising, nk)
        a = b
    return pieces


_PLANS: dict[tuple[str, bytes, bytes, bool], list[Piece] | None] = {}


def _plan_of(q_pos: Tensor, k_pos: Tensor, causal: bool) -> list[Piece] | None:
    """`plan`, remembered by the positions' values: a ring meets the same W blocks at every
    iteration, and cutting one (~0.1 ms in Python) would cost more than merging it."""
    key = (f"{q_pos.dtype} {k_pos.dtype}", q_pos.cpu().numpy().tobytes(),
           k_pos.cpu().numpy().tobytes(), causal)
    if key not in _PLANS:
        if len(_PLANS) >= 1024:
            _PLANS.clear()
        _PLANS[key] = plan(q_pos, k_pos, causal=causal)
    return _PLANS[key]


def _mask(q_pos: Tensor, k_pos: Tensor, dtype: torch.dtype) -> Tensor:
    """Additive (nq, nk) mask: 0 where key j is visible from query i, -inf elsewhere."""
    allowed = k_pos.cpu()[None, :] <= q_pos.cpu()[:, None]
    return torch.zeros(allowed.shape, dtype=dtype).masked_fill(~allowed, float("-inf"))


def _masked_rows(q_pos: Tensor, k_pos: Tensor) -> tuple[int, int]:
    """(first row that sees a key, keys any row sees): the masked call's window."""
    counts = _counts(q_pos, k_pos)
    return next((i for i, c in enumerate(counts) if c > 0), len(counts)), max(counts, default=0)


def _heads_as_batch(x: Tensor) -> Tensor:
    """(B, H, L, D) -> (B H, 1, L, D), a view for the ring's blocks. The kernel lays its
    results out as (B, L, H, D) in memory; with one head per batch entry that is contiguous,
    which a ring receive buffer must be, and no copy is needed."""
    return x.reshape(x.shape[0] * x.shape[1], 1, *x.shape[2:])


def _forward(q: Tensor, k: Tensor, v: Tensor, causal: bool,
             mask: Tensor | None = None) -> tuple[Tensor, Tensor]:
    """The fused forward kernel on (B, H, L, D) blocks: out (B, H, nq, D), lse (B, H, nq)."""
    out, lse = _FORWARD(*map(_heads_as_batch, (q, k, v)), 0.0, causal, attn_mask=mask)
    return out.view(q.shape), lse.view(q.shape[:-1])


def _backward(do: Tensor, q: Tensor, k: Tensor, v: Tensor, out: Tensor, lse: Tensor,
              causal: bool, mask: Tensor | None = None) -> tuple[Tensor, Tensor, Tensor]:
    """The fused backward kernel on (B, H, L, D) blocks: dq, dk, dv, contiguous."""
    grads = _BACKWARD(*map(_heads_as_batch, (do, q, k, v, out)),
                      lse.reshape(-1, 1, lse.shape[-1]), 0.0, causal, attn_mask=mask)
    return grads[0].view(q.shape), grads[1].view(k.shape), grads[2].view(v.shape)


def fused_attention(q: Tensor, k: Tensor, v: Tensor, q_pos: Tensor, k_pos: Tensor, *,
                    causal: bool) -> tuple[Tensor, Tensor]:
    """`block_attention`'s (out, lse) through the fused kernel: q (B, H, nq, D), k and v
    (B, H, nk, D), global positions q_pos (nq,), k_pos (nk,). out (B, H, nq, D) and lse
    (B, H, nq) in float32 (float64 for float64); masked rows give 0 and -inf."""
    pieces = _plan_of(q_pos, k_pos, causal)
    if pieces is None or q.device.type != "cpu":
        return block_attention(q, k, v, q_pos, k_pos, causal=causal)
    acc = accum_dtype(q.dtype)
    q, k, v = q.to(acc), k.to(acc), v.to(acc)
    nq = q.shape[-2]
    if len(pieces) == 1 and pieces[0].q0 == 0 and pieces[0].q1 == nq:
        p = pieces[0]
        return _forward(q, k[..., p.k0:p.k1, :], v[..., p.k0:p.k1, :], p.causal)
    out = torch.zeros(q.shape, dtype=acc)  # (B, H, nq, D)
    lse = torch.full(q.shape[:-1], float("-inf"), dtype=acc)  # (B, H, nq)
    if len(pieces) > MAX_PIECES:
        a, c = _masked_rows(q_pos, k_pos)
        o, lse_p = _forward(q[..., a:, :], k[..., :c, :], v[..., :c, :], False,
                            _mask(q_pos[a:], k_pos[:c], acc))
        out[..., a:, :], lse[..., a:] = o, lse_p
        return out, lse
    for p in pieces:
        o, lse_p = _forward(q[..., p.q0:p.q1, :], k[..., p.k0:p.k1, :], v[..., p.k0:p.k1, :],
                            p.causal)
        if p.k0 > 0:  # a rising run's causal piece: merge it with the run's full head
            o, lse_p = _merge(out[..., p.q0:p.q1, :], lse[..., p.q0:p.q1], o, lse_p)
        out[..., p.q0:p.q1, :], lse[..., p.q0:p.q1] = o, lse_p
    return out, lse


def _merge(out_a: Tensor, lse_a: Tensor, out_b: Tensor, lse_b: Tensor) -> tuple[Tensor, Tensor]:
    """Two pieces over disjoint keys of the same rows, both with finite lse."""
    lse = torch.logaddexp(lse_a, lse_b)
    return (torch.exp(lse_a - lse)[..., None] * out_a
            + torch.exp(lse_b - lse)[..., None] * out_b), lse


def merge_into(out: Tensor, lse: Tensor, out_b: Tensor,
               lse_b: Tensor) -> tuple[Tensor, Tensor]:
    """`merge_partials` for the reference ring: the same (out, lse), computed in place in out
    (two passes over it instead of four, no new (B, H, n, D) tensor); into the empty partial
    (every lse -inf: nothing seen yet) the other partial is the result as it is."""
    if bool(torch.isneginf(lse).all()):
        return out_b, lse_b
    merged = torch.logaddexp(lse, lse_b)  # (B, H, n); -inf only where both are
    shift = torch.where(torch.isfinite(merged), merged, torch.zeros_like(merged))
    out.mul_(torch.exp(lse - shift)[..., None])  # weights in [0, 1]; 0 for a -inf side
    out.addcmul_(out_b, torch.exp(lse_b - shift)[..., None])
    return out, merged


def fused_attention_backward(q: Tensor, k: Tensor, v: Tensor, out: Tensor, lse: Tensor,
                             dout: Tensor, q_pos: Tensor, k_pos: Tensor, *,
                             causal: bool) -> tuple[Tensor, Tensor, Tensor]:
    """`block_attention_backward`'s (dq, dk, dv) through the fused backward kernel: out, lse
    and dout belong to the queries' full attention (all key blocks)."""
    pieces = _plan_of(q_pos, k_pos, causal)
    if pieces is None or q.device.type != "cpu":
        return block_attention_backward(q, k, v, out, lse, dout, q_pos, k_pos, causal=causal)
    acc = lse.dtype
    q, k, v, out, do = q.to(acc), k.to(acc), v.to(acc), out.to(acc), dout.to(acc)
    nq, nk = q.shape[-2], k.shape[-2]
    if len(pieces) == 1 and (pieces[0].q0, pieces[0].q1, pieces[0].k0, pieces[0].k1) == (
            0, nq, 0, nk):
        return _backward(do, q, k, v, out, lse, pieces[0].causal)
    dq, dk, dv = (torch.zeros(t.shape, dtype=acc) for t in (q, k, v))
    if len(pieces) > MAX_PIECES:
        a, c = _masked_rows(q_pos, k_pos)
        pieces, mask = [Piece(a, nq, 0, c, False)], _mask(q_pos[a:], k_pos[:c], acc)
    else:
        mask = None
    for p in pieces:
        rows, keys = slice(p.q0, p.q1), slice(p.k0, p.k1)
        g_q, g_k, g_v = _backward(do[..., rows, :], q[..., rows, :], k[..., keys, :],
                                  v[..., keys, :], out[..., rows, :], lse[..., rows],
                                  p.causal, mask)
        dq[..., rows, :] += g_q
        dk[..., keys, :] += g_k
        dv[..., keys, :] += g_v
    return dq, dk, dv
