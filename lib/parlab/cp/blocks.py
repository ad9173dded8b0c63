r"""Blockwise attention with the online softmax: the single-device half of context parallelism.

One query block against one key/value block, with global token positions for the causal mask:

$$S_{ij} = \frac{q_i \cdot k_j}{\sqrt{D}} \ (-\infty \text{ where causal and } p^k_j > p^q_i), \quad
\ell_i = \log\sum_j e^{S_{ij}}, \quad o_i = \sum_j e^{S_{ij}-\ell_i}\, v_j.$$

A row with every key masked has $\ell_i = -\infty$ and $o_i = 0$. Two partial results over
disjoint key sets A and B merge exactly through their log-sum-exps (the online softmax):

$$\ell = m + \log\left(e^{\ell_A - m} + e^{\ell_B - m}\right),\ m = \max(\ell_A, \ell_B), \qquad
o = e^{\ell_A-\ell}\,o_A + e^{\ell_B-\ell}\,o_B.$$

The shift by m keeps every exponent $\le 0$, so nothing overflows (float32's exp overflows
above 88.7); both -inf gives $\ell = -\infty$, $o = 0$. Partial results and log-sum-exps are
kept in float32 (float64 for float64 inputs): bf16 keeps 8 significant bits, so an $\ell$ near
10 would be off by up to 0.03, a 3% error in every weight $e^{\ell_A - \ell}$.

Backward, with the full row's $\ell$ from the forward and $\delta_i = \sum_d dO_{id} O_{id}$:
$P = e^{S - \ell}$, $dV = P^\top dO$, $dP = dO\,V^\top$, $dS = P \circ (dP - \delta)$,
$dQ = dS\,K/\sqrt{D}$, $dK = dS^\top Q/\sqrt{D}$, summed over key blocks (dQ) and query blocks
(dK, dV).

These functions carry no hooks: the checks watch a learner's ring from outside (every
communication call through `parlab.comm`, every matrix product through a torch function mode), and
`parlab.cp.ring` takes the block function as an argument (`attend`) where a measurement needs
to replace it.
Layouts and closed-form work counts are in `parlab.cp.layout`, the ring in `parlab.cp.ring`.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

__all__ = ["block_attention", "block_attention_backward", "merge_partials", "full_attention",
           "empty_partial", "accum_dtype"]

# --- forward ----------------------------------------------------------------------------------

def accum_dtype(dtype: torch.dtype) -> torch.dtype:
    """float32 for float32/bf16/fp16 inputs, float64 for float64: where partials live."""
    return torch.promote_types(dtype, torch.float32)


def _scores(q: Tensor, k: Tensor, q_pos: Tensor, k_pos: Tensor, causal: bool) -> Tensor:
    acc = accum_dtype(q.dtype)
    s = torch.matmul(q.to(acc), k.to(acc).transpose(-2, -1)) / math.sqrt(q.shape[-1])
    if causal:  # (nq, nk): key j is visible from query i iff its position is not later
        allowed = k_pos.to(q.device)[None, :] <= q_pos.to(q.device)[:, None]
        s = s.masked_fill(~allowed, float("-inf"))  # (B, H, nq, nk)
    return s


def block_attention(q: Tensor, k: Tensor, v: Tensor, q_pos: Tensor, k_pos: Tensor, *,
                    causal: bool) -> tuple[Tensor, Tensor]:
    """One query block against one key/value block: (out, lse), see the module docstring.

    q (B, H, nq, D), k and v (B, H, nk, D), q_pos (nq,) and k_pos (nk,) global positions.
    Returns out (B, H, nq, D) and lse (B, H, nq), both float32 (float64 for float64 inputs).
    """
    s = _scores(q, k, q_pos, k_pos, causal)  # (B, H, nq, nk)
    lse = torch.logsumexp(s, dim=-1)  # (B, H, nq); -inf on fully masked rows
    shift = torch.where(torch.isfinite(lse), lse, torch.zeros_like(lse))
    p = torch.exp(s - shift[..., None])  # (B, H, nq, nk); 0 where masked
    out = torch.matmul(p, v.to(p.dtype))  # (B, H, nq, D)
    return out, lse


def empty_partial(q: Tensor) -> tuple[Tensor, Tensor]:
    """The merge's identity: out = 0 and lse = -inf (no key seen yet), in q's accum dtype."""
    acc = accum_dtype(q.dtype)
    out = torch.zeros(q.shape, dtype=acc, device=q.device)  # (B, H, n, D)
    return out, torch.full(q.shape[:-1], float("-inf"), dtype=acc, device=q.device)


def merge_partials(out_a: Tensor, lse_a: Tensor, out_b: Tensor,
                   lse_b: Tensor) -> tuple[Tensor, Tensor]:
    """Attention over keys A ∪ B from the partials over A and over B (module docstring)."""
    m = torch.maximum(lse_a, lse_b)  # (B, H, n)
    m = torch.where(torch.isfinite(m), m, torch.zeros_like(m))  # both -inf: any finite shift
    wa, wb = torch.exp(lse_a - m), torch.exp(lse_b - m)  # each in [0, 1], one of them 1
    total = wa + wb
    lse = m + torch.log(total)  # -inf when both are -inf
    safe = torch.where(total > 0, total, torch.ones_like(total))
    out = (wa / safe)[..., None] * out_a + (wb / safe)[..., None] * out_b  # (B, H, n, D)
    return out, lse


def full_attention(q: Tensor, k: Tensor, v: Tensor, *, causal: bool) -> tuple[Tensor, Tensor]:
    """Softmax attention over the whole sequence (positions 0..T-1): (out, lse)."""
    pos = torch.arange(q.shape[-2])
    s = _scores(q, k, pos, pos, causal)  # (B, H, T, T)
    return torch.softmax(s, dim=-1) @ v.to(s.dtype), torch.logsumexp(s, dim=-1)


# --- backward ---------------------------------------------------------------------------------

def block_attention_backward(q: Tensor, k: Tensor, v: Tensor, out: Tensor, lse: Tensor,
                             dout: Tensor, q_pos: Tensor, k_pos: Tensor, *,
                             causal: bool) -> tuple[Tensor, Tensor, Tensor]:
    """This key block's share of the gradients: (dq, dk, dv), see the module docstring.

    out, lse and dout belong to the queries' FULL attention (all key blocks): out (B, H, nq,
    D), lse (B, H, nq). dq is this block's term of a sum over key blocks; dk and dv are the
    terms these queries add to the gradients of this key/value block. float32 or float64.
    """
    s = _scores(q, k, q_pos, k_pos, causal)  # (B, H, nq, nk)
    acc, scale = s.dtype, 1.0 / math.sqrt(q.shape[-1])
    shift = torch.where(torch.isfinite(lse), lse, torch.zeros_like(lse)).to(acc)
    p = torch.exp(s - shift[..., None])  # (B, H, nq, nk): the full softmax's entries
    do = dout.to(acc)
    delta = (do * out.to(acc)).sum(-1, keepdim=True)  # (B, H, nq, 1)
    dv = p.transpose(-2, -1) @ do  # (B, H, nk, D)
    ds = p * (do @ v.to(acc).transpose(-2, -1) - delta)  # (B, H, nq, nk)
    dq = ds @ k.to(acc) * scale  # (B, H, nq, D)
    dk = ds.transpose(-2, -1) @ q.to(acc) * scale  # (B, H, nk, D)
    return dq, dk, dv
