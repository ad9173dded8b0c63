r"""Ring attention over isend/irecv: the communication half of context parallelism.

W ranks each hold n = T/W tokens of q, k and v (which tokens: a layout, `parlab.cp.layout`)
and `pos`, the (W, n) table of every rank's global positions, the same on every rank. At step
s = 0..W-1 rank r holds the K/V block of rank $(r - s) \bmod W$:

    forward, step s:  post isend(K, V -> right), irecv(K', V' <- left)   [not at the last step]
                      (even ranks send first, odd ranks receive first: NCCL needs it at W=2)
                      compute block_attention(q, K, V) and merge it       [the transfer flies]
                      wait; K, V = K', V'

Over W steps every query meets every key; the partial results merge exactly through their
log-sum-exps (`parlab.cp.merge_partials`), kept in float32. Each rank sends its neighbour
$W-1$ K/V blocks, $2(W-1)\,nHD\,d$ bytes per batch element. With `overlap=False` the ring
waits for each transfer before computing: the version whose time is compute plus transfers.

Backward: K and V go round again, and with them the accumulators dK, dV of the block they
belong to. Rank r adds its queries' terms to the accumulators of block $(r-s) \bmod W$ and
passes them on; after W steps (one more than K and V) they are home. dQ stays put.

`RingAttention` / `ring_attention` wrap both as an autograd function. Fully masked blocks
(causal, every key after every query) are skipped; the layout decides how many there are.

Under a profiler (`parlab.launch.run(..., trace=path)`) each step is a set of ranges: forward
"ring step s send/recv" (posting the transfer), "ring step s compute" (one block and its
merge), "ring step s wait" (blocked on the transfer); backward "ring backward step s ..." with
"send/recv K/V", "compute", "send/recv dK/dV", "wait dK/dV" and "wait K/V". The transfers
themselves are gloo's "gloo:recv" ranges, from posting to arrival: under a profiler a thread
waits for each step's messages as soon as they are posted (`parlab.timeline.watched`), since
gloo sees a message arrive only when someone waits for it.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Sequence
from typing import Any, Protocol

import torch
import torch.distributed as dist
from torch import Tensor
from torch.profiler import record_function

from parlab import timeline
from parlab.cp.blocks import (
    block_attention,
    block_attention_backward,
    empty_partial,
    merge_partials,
)
from parlab.cp.fused import fused_attention, fused_attention_backward, merge_into

__all__ = ["Transfer", "shift_right", "ring_attention_forward", "ring_attention_backward",
           "RingAttention", "ring_attention", "fully_masked"]

Attend = Callable[..., tuple[Tensor, Tensor]]

# The block kernel of this reference ring: PyTorch's fused flash attention (`parlab.cp.fused`)
# when True; the block kernel with the maths spelled out (`parlab.cp.blocks`) when False.
FUSED = True


def _kernels() -> tuple[Attend, Callable[..., tuple[Tensor, Tensor, Tensor]], Attend]:
    """(block forward, block backward, merge) of the reference path."""
    return ((fused_attention, fused_attention_backward, merge_into) if FUSED else
            (block_attention, block_attention_backward, merge_partials))


class Transfer:
    """Posted sends and receives of one ring step; `wait()` returns the received tensors."""

    def __init__(self, handles: list[Any], received: list[Tensor]) -> None:
        self.handles, self.received = handles, received

    def wait(self) -> list[Tensor]:
        for handle in self.handles:
            handle.wait()
        self.handles = []
        return self.received


def _ring(group: Any) -> tuple[int, int, int, int]:
    """(rank in group, group size, global rank of the right and of the left neighbour)."""
    rank, world = dist.get_rank(group), dist.get_world_size(group)
    if group is None:
        return rank, world, (rank + 1) % world, (rank - 1) % world
    return (rank, world, dist.get_global_rank(group, (rank + 1) % world),
            dist.get_global_rank(group, (rank - 1) % world))


def shift_right(tensors: Sequence[Tensor], *, group: Any = None) -> Transfer:
    """Post, for each tensor, an isend of it to the right neighbour and an irecv of its shape
    from the left one; even ranks send first, odd ranks receive first. Nothing blocks. With
    2 ranks the left and right neighbour are one rank, and NCCL runs a pair's calls in the
    order posted: if both received first, both would wait for ever (parlab.launch.nccl_rules)."""
    rank, _, right, left = _ring(group)
    handles, received = [], []
    for t in tensors:
        buf = torch.empty_like(t)
        send = dist.isend(t.contiguous(), dst=right, group=group) if rank % 2 == 0 else None
        handles.append(dist.irecv(buf, src=left, group=group))
        handles.append(send or dist.isend(t.contiguous(), dst=right, group=group))
        received.append(buf)
    return Transfer(timeline.watched(handles), received)  # (a watcher under a profiler)


class Pending(Protocol):
    """A posted transfer: `wait()` blocks until it is done and returns what was received."""

    def wait(self) -> list[Tensor]: ...


class Shift(Protocol):
    """How a ring step posts its transfer: `shift_right`'s signature."""

    def __call__(self, tensors: Sequence[Tensor], *, group: Any = None) -> Pending: ...


def _range(name: str, on: bool = True) -> contextlib.AbstractContextManager:
    """A profiler range `name` (a no-op where `on` is False)."""
    return record_function(name) if on else contextlib.nullcontext()


def fully_masked(q_pos: Tensor, k_pos: Tensor, *, causal: bool) -> bool:
    """True when causal and every key comes after every query: the block adds nothing."""
    return causal and int(k_pos.min()) > int(q_pos.max())


def ring_attention_forward(q: Tensor, k: Tensor, v: Tensor, pos: Tensor, *, causal: bool,
                           overlap: bool = True, attend: Attend | None = None,
                           shift: Shift | None = None,
                           group: Any = None) -> tuple[Tensor, Tensor]:
    """This rank's attention output over the whole sequence: (out, lse).

    q, k, v (B, H, n, D): this rank's tokens; pos (W, n) every rank's global positions.
    Returns out (B, H, n, D) in q's dtype and lse (B, H, n) in float32 (float64 for float64).
    `attend` computes one block and `shift` posts one step's transfer (`shift_right`): the
    overlap measurement passes a block of known cost and a link of known speed.
    """
    attend = _kernels()[0] if attend is None else attend
    shift = shift_right if shift is None else shift
    rank, world, _, _ = _ring(group)
    out, lse = empty_partial(q)  # (B, H, n, D), (B, H, n): nothing seen yet
    kv = [k.contiguous(), v.contiguous()]
    for step in range(world):
        src = (rank - step) % world  # whose K/V block this rank holds now
        with _range(f"ring step {step} send/recv", step + 1 < world):
            transfer = shift(kv, group=group) if step + 1 < world else None
        if transfer is not None and not overlap:
            with _range(f"ring step {step} wait"):
                transfer.wait()  # the version that waits: nothing hides this transfer
        if not fully_masked(pos[rank], pos[src], causal=causal):
            with _range(f"ring step {step} compute"):
                part = attend(q, kv[0], kv[1], pos[rank], pos[src], causal=causal)
                out, lse = _kernels()[2](out, lse, *part)
        if transfer is not None:
            with _range(f"ring step {step} wait", overlap):
                kv = transfer.wait()  # the next block, which flew while this one computed
    return out.to(q.dtype), lse


def ring_attention_backward(q: Tensor, k: Tensor, v: Tensor, out: Tensor, lse: Tensor,
                            dout: Tensor, pos: Tensor, *, causal: bool, shift: Shift | None = None,
                            group: Any = None) -> tuple[Tensor, Tensor, Tensor]:
    """(dq, dk, dv) of this rank's tokens, given its forward out and lse and the gradient
    dout of its output (all (B, H, n, D) but lse (B, H, n)). Gradients in q's dtype.
    `shift` posts each transfer, as in the forward (`shift_right`)."""
    shift = shift_right if shift is None else shift
    rank, world, _, _ = _ring(group)
    kv = [k.contiguous(), v.contiguous()]
    dq = torch.zeros_like(q, dtype=lse.dtype)  # (B, H, n, D)
    grads: Pending | None = None  # the accumulators arriving from the left
    for step in range(world):
        src = (rank - step) % world
        with _range(f"ring backward step {step} send/recv K/V", step + 1 < world):
            transfer = shift(kv, group=group) if step + 1 < world else None
        if fully_masked(pos[rank], pos[src], causal=causal):  # these queries add nothing
            dk_b = torch.zeros_like(kv[0], dtype=lse.dtype)
            dv_b = torch.zeros_like(kv[1], dtype=lse.dtype)
        else:
            with _range(f"ring backward step {step} compute"):
                dq_b, dk_b, dv_b = _kernels()[1](q, kv[0], kv[1], out, lse, dout, pos[rank],
                                                 pos[src], causal=causal)
                dq += dq_b
                del dq_b  # held no longer than needed: the ring's memory is what it is for
        if grads is not None:  # block src's accumulators, as the left neighbour passed them
            with _range(f"ring backward step {step} wait dK/dV"):
                dk_in, dv_in = grads.wait()
            dk_b += dk_in  # dk_b and dv_b are this step's own tensors: add in place
            dv_b += dv_in
            del dk_in, dv_in
        with _range(f"ring backward step {step} send/recv dK/dV"):
            grads = shift([dk_b, dv_b], group=group)  # on to the next holder of block src
        if transfer is not None:
            with _range(f"ring backward step {step} wait K/V"):
                kv = transfer.wait()
    assert grads is not None
    with _range(f"ring backward step {world} wait dK/dV"):
        dk, dv = grads.wait()  # after W hops, block `rank`'s accumulators are home
    return dq.to(q.dtype), dk.to(k.dtype), dv.to(v.dtype)


class RingAttention(torch.autograd.Function):
    """Ring attention as an autograd function: forward and backward both go round the ring."""

    @staticmethod
    def forward(ctx: Any, q: Tensor, k: Tensor, v: Tensor, pos: Tensor, causal: bool,
                group: Any = None, shift: Shift | None = None) -> Tensor:
        out, lse = ring_attention_forward(q, k, v, pos, causal=causal, shift=shift,
                                          group=group)
        ctx.save_for_backward(q, k, v, out, lse, pos)
        ctx.causal, ctx.group, ctx.shift = causal, group, shift
        return out

    @staticmethod
    def backward(ctx: Any, dout: Tensor) -> tuple:
        q, k, v, out, lse, pos = ctx.saved_tensors
        dq, dk, dv = ring_attention_backward(q, k, v, out, lse, dout, pos, causal=ctx.causal,
                                             shift=ctx.shift, group=ctx.group)
        return dq, dk, dv, None, None, None, None


def ring_attention(q: Tensor, k: Tensor, v: Tensor, pos: Tensor, *, causal: bool,
                   group: Any = None, shift: Shift | None = None) -> Tensor:
    """Differentiable ring attention: this rank's (B, H, n, D) output. `shift` posts each
    transfer, forward and backward (`shift_right`; benchmarks/bench_cp.py passes one that
    moves nothing)."""
    return RingAttention.apply(q, k, v, pos, causal, group, shift)
