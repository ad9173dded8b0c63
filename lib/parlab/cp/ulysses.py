r"""Ulysses: context parallelism by all-to-all (DeepSpeed-Ulysses, Jacobs et al., arXiv:2309.14509).

c ranks each hold n = T/c tokens of q, k and v, every head of them. Attention mixes tokens
but never heads, so Ulysses trades the split: an all-to-all turns the sequence shards into
head shards, each rank attends over the whole sequence for H/c heads with any single-device
kernel, and an all-to-all turns the output back into sequence shards.

    seq_to_heads   (B, H, n, D) on each rank -> (B, H/c, T, D)
                   rank r sends its tokens of head block j (heads j H/c .. (j+1) H/c - 1) to
                   rank j and receives every rank's tokens of head block r, in rank order
    heads_to_seq   (B, H/c, T, D) -> (B, H, n, D): the same exchange backwards

Both are one `dist.all_to_all_single` of equal splits over a (c, ...) tensor whose block j
goes to rank j (gloo's list `all_to_all` needs equal sizes too; the single form is what
NCCL and gloo share). The tokens arrive in rank order, so the gathered sequence's global
positions are `pos.flatten()` for the (c, n) position table `pos`, whatever the layout: the
causal mask uses them, and every rank sees the same causal triangle (no imbalance to fix).

Bytes. Each all-to-all keeps the 1/c of a rank's tensor that is its own and sends the rest,
$\frac{c-1}{c}$ of $b\,n\,h\,d$ bytes ($h = HD$ features, d bytes per element). Forward: q,
k and v in, the output back: four of them, $4\frac{c-1}{c}\frac{bsh}{c}d$ per rank and layer
(`parlab.costs.ulysses_bytes_per_layer`); the backward's transposes are the same four again
(the output's gradient in, dq, dk and dv back). With grouped-query attention (H_kv < H key
and value heads) k and v shrink to $h_{kv} = H_{kv}D$ features.

The cap. A rank needs whole heads: c must divide H, and H_kv (`check_heads` says so before
any exchange). Under tensor parallelism each TP rank already holds H/t heads, so Ulysses over
c ranks needs c | H/t (and H_kv/t): c at most the heads a TP rank has. Ring attention has no
such cap; it splits the sequence as far as the block stays long enough to hide its transfer.

`UlyssesAttention` / `ulysses_attention` are the differentiable layer: the forward's four
all-to-alls, the local attention (`parlab.cp.block_attention` over every position), and in
backward the local block backward (`block_attention_backward`) between four more.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist
from torch import Tensor

from parlab.cp.blocks import block_attention, block_attention_backward

__all__ = ["check_heads", "seq_to_heads", "heads_to_seq", "UlyssesAttention",
           "ulysses_attention", "ulysses_attention_forward"]


def check_heads(heads: int, c: int, *, kv_heads: int | None = None, what: str = "Ulysses"
                ) -> None:
    """Raise ValueError unless c ranks can each take whole heads (module docstring)."""
    for name, h in (("query heads", heads), ("key/value heads", kv_heads)):
        if h is not None and h % c:
            raise ValueError(
                f"{what} gives each of its {c} ranks an equal share of whole heads, but there "
                f"are {h} {name}, not a multiple of {c}: Ulysses caps at the head count "
                "(under TP, at the heads one TP rank holds). Use a degree dividing it, or ring "
                "attention for the rest of the sequence split")


def _world(group: Any) -> int:
    return dist.get_world_size(group)


def seq_to_heads(x: Tensor, *, group: Any = None) -> Tensor:
    """(B, H, n, D) this rank's n tokens, every head -> (B, H/c, c n, D): every token of this
    rank's H/c heads, rank 0's tokens first."""
    c = _world(group)
    b, h, n, d = x.shape
    check_heads(h, c)
    send = x.reshape(b, c, h // c, n, d).transpose(0, 1).contiguous()  # (c, B, H/c, n, D)
    recv = torch.empty_like(send)  # recv[i]: rank i's n tokens of my heads
    dist.all_to_all_single(recv, send, group=group)
    return recv.permute(1, 2, 0, 3, 4).reshape(b, h // c, c * n, d)


def heads_to_seq(y: Tensor, *, group: Any = None) -> Tensor:
    """(B, H/c, T, D) every token of this rank's heads -> (B, H, T/c, D): this rank's tokens,
    every head (the inverse of `seq_to_heads`)."""
    c = _world(group)
    b, hc, t, d = y.shape
    if t % c:
        raise ValueError(f"heads_to_seq: {t} tokens do not split over c = {c} ranks")
    n = t // c
    send = y.reshape(b, hc, c, n, d).permute(2, 0, 1, 3, 4).contiguous()  # (c, B, H/c, n, D)
    recv = torch.empty_like(send)  # recv[i]: head block i of my n tokens
    dist.all_to_all_single(recv, send, group=group)
    return recv.transpose(0, 1).reshape(b, c * hc, n, d)


def _expand(kv: Tensor, heads: int) -> Tensor:
    """(B, Hkv/c, T, D) -> (B, H/c, T, D): each local K/V head serves its group of queries."""
    g = heads // kv.shape[1]
    return kv if g == 1 else kv.repeat_interleave(g, dim=1)


def _fold(grad: Tensor, kv_heads: int) -> Tensor:
    """The inverse of `_expand` for gradients: sum each group's query heads."""
    b, h, t, d = grad.shape
    return grad if h == kv_heads else grad.reshape(b, kv_heads, h // kv_heads, t, d).sum(2)


def ulysses_attention_forward(q: Tensor, k: Tensor, v: Tensor, pos: Tensor, *, causal: bool,
                              group: Any = None) -> tuple[Tensor, list[Tensor]]:
    """This rank's output (B, H, n, D) and what the backward needs (head layout).

    q (B, H, n, D); k, v (B, H_kv, n, D), H_kv dividing H; pos (c, n) every rank's global
    positions. Four all-to-alls: q, k, v to heads, the output back."""
    c = _world(group)
    check_heads(q.shape[1], c, kv_heads=k.shape[1])
    qh, kh, vh = (seq_to_heads(x, group=group) for x in (q, k, v))  # (B, H/c, T, D) ...
    every = pos.reshape(-1)  # (T,) positions of the gathered tokens, rank by rank
    out_h, lse_h = block_attention(qh, _expand(kh, qh.shape[1]), _expand(vh, qh.shape[1]),
                                   every, every, causal=causal)
    out_h = out_h.to(q.dtype)  # what the exchange back carries: the input dtype
    return heads_to_seq(out_h, group=group), [qh, kh, vh, out_h, lse_h, every]


class UlyssesAttention(torch.autograd.Function):
    """Ulysses attention as an autograd function: four all-to-alls forward, four backward."""

    @staticmethod
    def forward(ctx: Any, q: Tensor, k: Tensor, v: Tensor, pos: Tensor, causal: bool,
                group: Any = None) -> Tensor:
        out, saved = ulysses_attention_forward(q, k, v, pos, causal=causal, group=group)
        ctx.save_for_backward(*saved)
        ctx.causal, ctx.group = causal, group
        return out

    @staticmethod
    def backward(ctx: Any, dout: Tensor) -> tuple:
        qh, kh, vh, out_h, lse_h, every = ctx.saved_tensors
        dout_h = seq_to_heads(dout.contiguous(), group=ctx.group)  # (B, H/c, T, D)
        heads = qh.shape[1]
        dq, dk, dv = block_attention_backward(qh, _expand(kh, heads), _expand(vh, heads),
                                              out_h, lse_h, dout_h, every, every,
                                              causal=ctx.causal)
        dk, dv = _fold(dk, kh.shape[1]), _fold(dv, vh.shape[1])
        grads = [heads_to_seq(g.to(x.dtype), group=ctx.group)
                 for g, x in ((dq, qh), (dk, kh), (dv, vh))]
        return *grads, None, None, None


def ulysses_attention(q: Tensor, k: Tensor, v: Tensor, pos: Tensor, *, causal: bool,
                      group: Any = None) -> Tensor:
    """Differentiable Ulysses attention: this rank's (B, H, n, D) output (module docstring)."""
    return UlyssesAttention.apply(q, k, v, pos, causal, group)
