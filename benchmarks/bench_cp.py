"""Context-parallel attention, forward + backward: ring attention against all-gathering K, V.

    make bench        or        .venv/bin/python benchmarks/bench_cp.py [--repeats 10]

On W = 2 and 4 gloo ranks (parlab.launch.run) every rank draws the same seeded q, k, v of
shape (B, H, T, D) and keeps the T/W tokens its layout gives it (`parlab.cp.layout`). Three
ways to compute its queries' attention over the whole sequence:

- ring: `parlab.cp.ring_attention`, K/V blocks passed round the ring with isend/irecv,
  each step's transfer hidden behind the previous block's compute, partials merged by their
  log-sum-exps; fully masked causal blocks skipped;
- gather+SDPA: every rank gathers all K and V (backward: a reduce-scatter sums their
  gradients back to their owners), then one `F.scaled_dot_product_attention` over the whole
  sequence (causal: a mask from positions);
- gather+block: the same gather, then the ring's own kernel (`parlab.cp.block_attention`)
  on the one (n, T) block, differentiated by autograd: the same maths as the ring without
  the ring, which separates what the ring costs from what the kernel costs.

Causal and not; causal with the contiguous layout (the last rank has about 2W-1 times the
first one's work, and the ring waits for it) and the balanced zigzag one. The ring skips only
fully masked blocks, and zigzag has none: every rank computes all W blocks, partly masked.
An iteration is forward and backward with a fixed output gradient. All three must first agree
(output, dq, dk, dv within 1e-5, relative); then they take turns (benchmarks/_table.py) and
rank 0 reports medians and the ring's time over each other's.
TORCH_DISTRIBUTED_DEBUG is OFF for all three (see `_table.no_debug_checks`).
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist
import torch.nn.functional as F
from _table import Table, agree, interleave, medians, ms, ratio, repeats_option, setting
from torch import Tensor

from parlab.cp import block_attention, position_table, ring_attention
from parlab.launch import run

B, H, T, D = 1, 4, 1024, 64
CASES = [("contiguous", False), ("contiguous", True), ("zigzag", True)]  # (layout, causal)
TOLERANCE = 1e-5


class GatherTokens(torch.autograd.Function):
    """Forward: all-gather the token dim, (B, H, n, D) -> (B, H, W n, D) in rank order.
    Backward: reduce-scatter, each rank gets the sum over ranks of its own tokens' gradient.

    Not torch.distributed.nn.functional.all_gather: on gloo its backward returns wrong
    gradients when the incoming gradient is not contiguous, as SDPA's dk and dv are."""

    @staticmethod
    def forward(ctx: Any, x: Tensor) -> Tensor:
        parts = [torch.empty_like(x) for _ in range(dist.get_world_size())]
        dist.all_gather(parts, x.contiguous())
        return torch.cat(parts, dim=2)

    @staticmethod
    def backward(ctx: Any, grad: Tensor) -> Tensor:
        parts = [g.contiguous() for g in grad.chunk(dist.get_world_size(), dim=2)]
        out = torch.empty_like(parts[0])
        dist.reduce_scatter(out, parts)
        return out


def gathered_attention(q: Tensor, k: Tensor, v: Tensor, pos: Tensor, *, causal: bool) -> Tensor:
    """All-gather K and V (keys at positions pos.flatten()), then full attention of this
    rank's queries."""
    keys, values = GatherTokens.apply(k), GatherTokens.apply(v)  # (B, H, T, D)
    mask = None
    if causal:  # (n, T): query i sees key j iff j's position is not later
        mask = pos.flatten()[None, :] <= pos[dist.get_rank()][:, None]
    return F.scaled_dot_product_attention(q, keys, values, attn_mask=mask)


def gathered_blocks(q: Tensor, k: Tensor, v: Tensor, pos: Tensor, *, causal: bool) -> Tensor:
    """All-gather K and V, then the ring's own kernel (`parlab.cp.block_attention`) on the
    one (n, T) block, differentiated by autograd."""
    keys, values = GatherTokens.apply(k), GatherTokens.apply(v)  # (B, H, T, D)
    out, _ = block_attention(q, keys, values, pos[dist.get_rank()], pos.flatten(),
                             causal=causal)
    return out.to(q.dtype)


CONTENDERS: dict[str, Callable[..., Tensor]] = {
    "ring": ring_attention, "gather+SDPA": gathered_attention, "gather+block": gathered_blocks}


def step(attend: Callable[..., Tensor], local: list[Tensor], pos: Tensor, dout: Tensor,
         causal: bool) -> list[Tensor]:
    """Forward and backward; returns the output and dq, dk, dv of this rank's tokens."""
    q, k, v = (t.detach().requires_grad_() for t in local)
    out = attend(q, k, v, pos, causal=causal)
    out.backward(dout)
    return [out.detach(), q.grad, k.grad, v.grad]


def cp_worker(layout: str, causal: bool, repeats: int) -> dict:
    """In each rank: take this rank's tokens, check all three agree, time them in turns."""
    world, rank = dist.get_world_size(), dist.get_rank()
    gen = torch.Generator().manual_seed(0)
    q, k, v, dout = (torch.randn(B, H, T, D, generator=gen) for _ in range(4))
    pos = position_table(layout, world, T)  # (W, n)
    local = [t[:, :, pos[rank]] for t in (q, k, v)]  # (B, H, n, D) each
    dout = dout[:, :, pos[rank]]
    steps = {name: functools.partial(step, attend, local, pos, dout, causal)
             for name, attend in CONTENDERS.items()}
    ring = steps["ring"]()
    diff = max(agree(list(zip(ring, steps[name](), strict=True)), TOLERANCE)
               for name in ("gather+SDPA", "gather+block"))
    return {"diff": diff, "times": medians(interleave(steps, repeats, sync=dist.barrier))}


def main() -> None:
    repeats = repeats_option(__doc__, default=10, debug_checks=False)
    table = Table(setting(f"attention forward+backward over T={T} tokens, B={B}, H={H}, "
                          f"D={D}, float32, ms per iteration", repeats),
                  ["ranks W", "causal", "layout", "ring ms", "gather+SDPA ms",
                   "gather+block ms", "ring / gather+SDPA", "ring / gather+block",
                   "max rel. difference"])
    for world in (2, 4):
        for layout, causal in CASES:
            results = run(cp_worker, world, layout, causal, repeats, timeout=600)
            times, diff = results[0]["times"], max(r["diff"] for r in results)
            table.add(world, "yes" if causal else "no", layout,
                      *(ms(times[name]) for name in CONTENDERS),
                      ratio(times["ring"], times["gather+SDPA"]),
                      ratio(times["ring"], times["gather+block"]), f"{diff:.1e}")
    table.emit("cp")


if __name__ == "__main__":
    main()
