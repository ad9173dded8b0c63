"""Context-parallel attention, forward + backward: ring attention against all-gathering K, V.

    make bench        or        .venv/bin/python benchmarks/bench_cp.py [--repeats 10]
                                    [--context-parallel-only]

On W = 2 and 4 gloo ranks (parlab.launch.run) every rank draws the same seeded q, k, v of
shape (B, H, T, D) and keeps the T/W tokens its layout gives it (`parlab.cp.layout`). Two
ways to compute its queries' attention over the whole sequence:

- ring: `parlab.cp.ring_attention`, K/V blocks passed round the ring with isend/irecv, each
  step's transfer flying while the current block computes, partials merged by their
  log-sum-exps. Each block goes through PyTorch's fused flash-attention kernel
  (`parlab.cp.fused`): full, causal-diagonal (`is_causal`) or skipped, cut to the rows and keys
  the layout's mask leaves;
- gather+SDPA: every rank all-gathers K and V (backward: a reduce-scatter sums their
  gradients back to their owners), then one `F.scaled_dot_product_attention` of its queries
  over the whole sequence (causal: a mask from positions).

A third column times the ring with transfers that move nothing (`no_transfer`: each rank
computes on its own block W times, and its values are wrong): the ring's compute alone, its W
kernel calls and merges. What the ring takes beyond it is what its transfers cost. On this
machine they are not free even when they fly while a block computes: gloo moves the bytes
with the CPU (copies through the kernel's sockets), on cores that every rank's compute keeps
busy, and the ring sends 3W - 2 blocks of K and V (or dK and dV) a rank per iteration
against the 2W - 2 of an all-gather and a reduce-scatter. Overlap hides a transfer only where
something other than the computing cores moves it (a GPU's copy engines and NVLink).

Every layout (contiguous, striped, zigzag), causal and not. An iteration is forward and
backward with a fixed output gradient. Both must first agree (output, dq, dk, dv within 1e-5,
relative); then they take turns (benchmarks/_table.py) and rank 0 reports medians and the
ring's time over the gather's. Then fresh ranks measure the peak memory of each, of the
forward alone (no autograd) and of an iteration (benchmarks/_memory.py: peak RSS above the
RSS before the call; the largest over ranks is shown). The gathered version holds all W
blocks of K and V at once, and in the backward all W blocks of their gradients; the ring
holds its current block and the one arriving, 2/W of that, and in the backward the dK, dV
accumulators of two blocks (the one it adds to, the one arriving). Both also hold this
rank's queries' output and gradients, which do not shrink with W, so the ring's total is
above 2/W of the gather's, most at W = 2.
TORCH_DISTRIBUTED_DEBUG is OFF for both (see `_table.no_debug_checks`), and the launcher's status
line is not updated at every communication call (`_table.unwatched`), as in a training job.

A second table (alone: `--context-parallel-only`) puts the ring beside PyTorch's own
`context_parallel` where it runs on a CPU: not causal, load balancing off (contiguous
pieces, the ring's contiguous layout), SDPA under its math backend
(`parlab.cp.torch_cp.cp_sdpa`). Each rank keeps context_parallel's SDPA patch open for its
whole run and calls `F.scaled_dot_product_attention` on its own pieces: DTensor all-gathers
K and V, and in the backward all-gathers them again and reduce-scatters dK, dV (no ring on a
CPU). Per iteration, forward and backward: time, the bytes rank 0 sends (the ring's through
parlab.comm, DTensor's functional collectives through `parlab.cp.torch_cp.functional_trace`)
and the peak memory per rank (RSS, as above).
"""

from __future__ import annotations

import contextlib
import functools
import sys
from collections.abc import Callable, Iterator
from typing import Any

import torch
import torch.distributed as dist
import torch.nn.functional as F
from _memory import mib, peak_above
from _table import (
    Table,
    agree,
    interleave,
    medians,
    ms,
    ratio,
    repeats_option,
    setting,
    unwatched,
)
from torch import Tensor

from parlab import comm
from parlab.cp import LAYOUTS, Transfer, position_table, ring_attention, torch_cp
from parlab.launch import run

B, H, T, D = 1, 4, 1024, 64
CASES = [(layout, causal) for causal in (False, True) for layout in LAYOUTS]
TOLERANCE = 1e-5


class GatherTokens(torch.autograd.Function):
    """Forward: all-gather the token dim, (B, H, n, D) -> (B, H, W n, D) in rank order, into
    one token-major buffer (no copy of the gathered tensor). Backward: reduce-scatter, each
    rank gets the sum over ranks of its own tokens' gradient."""

    @staticmethod
    def forward(ctx: Any, x: Tensor) -> Tensor:
        local = x.permute(2, 0, 1, 3).contiguous()  # (n, B, H, D)
        full = local.new_empty((dist.get_world_size() * local.shape[0], *local.shape[1:]))
        dist.all_gather_single(full, local)  # (T, B, H, D)
        return full.permute(1, 2, 0, 3)  # (B, H, T, D), a view

    @staticmethod
    def backward(ctx: Any, grad: Tensor) -> Tensor:
        full = grad.permute(2, 0, 1, 3).contiguous()  # (T, B, H, D)
        out = full.new_empty((full.shape[0] // dist.get_world_size(), *full.shape[1:]))
        dist.reduce_scatter_single(out, full)  # (n, B, H, D)
        return out.permute(1, 2, 0, 3)


def gathered_attention(q: Tensor, k: Tensor, v: Tensor, pos: Tensor, *, causal: bool) -> Tensor:
    """All-gather K and V (keys at positions pos.flatten()), then full attention of this
    rank's queries."""
    keys, values = GatherTokens.apply(k), GatherTokens.apply(v)  # (B, H, T, D)
    mask = None
    if causal:  # (n, T): query i sees key j iff j's position is not later
        mask = pos.flatten()[None, :] <= pos[dist.get_rank()][:, None]
    return F.scaled_dot_product_attention(q, keys, values, attn_mask=mask)


def no_transfer(tensors: Any, *, group: Any = None) -> Transfer:
    """`parlab.cp.shift_right` without the communication: every block stays where it is."""
    return Transfer([], list(tensors))  # nothing to wait for; wait() gives them back


CONTENDERS: dict[str, Callable[..., Tensor]] = {
    "ring": ring_attention, "gather+SDPA": gathered_attention}
TIMED = {**CONTENDERS,
         "ring, no transfers": functools.partial(ring_attention, shift=no_transfer)}


def step(attend: Callable[..., Tensor], local: list[Tensor], pos: Tensor, dout: Tensor,
         causal: bool) -> list[Tensor]:
    """Forward and backward; returns the output and dq, dk, dv of this rank's tokens."""
    q, k, v = (t.detach().requires_grad_() for t in local)
    out = attend(q, k, v, pos, causal=causal)
    out.backward(dout)
    return [out.detach(), q.grad, k.grad, v.grad]


def _local(layout: str, heads: int = H) -> tuple[list[Tensor], Tensor, Tensor]:
    """This rank's tokens of the same seeded q, k, v and output gradient, and the layout."""
    world, rank = dist.get_world_size(), dist.get_rank()
    gen = torch.Generator().manual_seed(0)
    q, k, v, dout = (torch.randn(B, heads, T, D, generator=gen) for _ in range(4))
    pos = position_table(layout, world, T)  # (W, n)
    local = [t[:, :, pos[rank]].contiguous() for t in (q, k, v)]  # (B, H, n, D) each
    return local, dout[:, :, pos[rank]].contiguous(), pos


def forward_only(attend: Callable[..., Tensor], local: list[Tensor], pos: Tensor,
                 causal: bool) -> Tensor:
    """The forward alone, without autograd (inference, or prefill)."""
    with torch.no_grad():
        return attend(*local, pos, causal=causal)


def cp_worker(layout: str, causal: bool, repeats: int) -> dict:
    """In each rank: check both agree, then time them in turns."""
    local, dout, pos = _local(layout)
    steps = {name: functools.partial(step, attend, local, pos, dout, causal)
             for name, attend in TIMED.items()}
    with unwatched():
        diff = agree(list(zip(steps["ring"](), steps["gather+SDPA"](), strict=True)),
                     TOLERANCE)
        return {"diff": diff, "times": medians(interleave(steps, repeats, sync=dist.barrier))}


def cp_memory_worker(layout: str, causal: bool) -> dict[str, dict[str, int]]:
    """In each rank: the peak memory of each one's forward alone and of an iteration
    (forward and backward), benchmarks/_memory.py."""
    local, dout, pos = _local(layout)
    memory: dict[str, dict[str, int]] = {"forward": {}, "iteration": {}}
    with unwatched():
        for name, attend in CONTENDERS.items():
            dist.barrier()
            memory["forward"][name] = peak_above(
                functools.partial(forward_only, attend, local, pos, causal))
            dist.barrier()
            memory["iteration"][name] = peak_above(
                functools.partial(step, attend, local, pos, dout, causal))
    return memory


def _pair(memory: dict[str, int]) -> str:
    """'ring / gather (ratio)' in MiB."""
    ring, gather = memory["ring"], memory["gather+SDPA"]
    return f"{mib(ring)} / {mib(gather)} ({ratio(ring, gather)})"


@contextlib.contextmanager
def cp_patch() -> Iterator[None]:
    """context_parallel's SDPA patch over this rank's CP world, load balancing off, SDPA under
    the math backend: F.scaled_dot_product_attention inside takes this rank's (B, H, n, D)
    pieces as its share of the sequence."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor.experimental import _attention, context_parallel

    mesh = init_device_mesh("cpu", (dist.get_world_size(),), mesh_dim_names=("cp",))
    _attention._cp_options.enable_load_balance = False
    held = torch.zeros(T)  # context_parallel needs a buffer to cut; the pieces come ready
    with torch_cp.cp_sdpa("cpu"), context_parallel(mesh, buffers=[held], buffer_seq_dims=[0]):
        yield


def sdpa(q: Tensor, k: Tensor, v: Tensor, pos: Tensor, *, causal: bool) -> Tensor:
    """F.scaled_dot_product_attention, which context_parallel's patch turns into DTensor's."""
    return F.scaled_dot_product_attention(q, k, v, is_causal=causal)


TORCH_CP: dict[str, Callable[..., Tensor]] = {"ring": ring_attention, "context_parallel": sdpa}
TORCH_H = 2  # heads: with H = 4 at W = 4 (n = 256, D = 64) DTensor shards the heads instead,
# and context_parallel hands back a head shard as if it were this rank's piece (measured)


def torch_cp_worker(repeats: int) -> dict:
    """In each rank: both agree, then time them in turns; the bytes of one iteration each."""
    local, dout, pos = _local("contiguous", TORCH_H)
    steps = {name: functools.partial(step, attend, local, pos, dout, False)
             for name, attend in TORCH_CP.items()}
    with unwatched(), cp_patch():
        diff = agree(list(zip(steps["ring"](), steps["context_parallel"](), strict=True)),
                     TOLERANCE)
        with comm.trace() as ring_sent:
            steps["ring"]()
        with torch_cp.functional_trace() as cp_sent:
            steps["context_parallel"]()
        times = medians(interleave(steps, repeats, sync=dist.barrier))
    return {"diff": diff, "times": times, "sent": {"ring": ring_sent.wire_bytes(),
                                                   "context_parallel": cp_sent.wire_bytes()}}


def torch_cp_memory_worker() -> dict[str, int]:
    """In each rank: the peak memory of an iteration of each (benchmarks/_memory.py)."""
    local, dout, pos = _local("contiguous", TORCH_H)
    with unwatched(), cp_patch():
        peaks = {}
        for name, attend in TORCH_CP.items():
            dist.barrier()
            peaks[name] = peak_above(functools.partial(step, attend, local, pos, dout, False))
    return peaks


def torch_cp_table(repeats: int) -> None:
    table = Table(setting(f"ring attention against PyTorch's context_parallel on a CPU (not "
                          f"causal, contiguous pieces, SDPA's math backend: DTensor "
                          f"all-gathers K and V), T={T} tokens, B={B}, H={TORCH_H}, D={D}, "
                          f"float32; "
                          f"ms per iteration (forward and backward), bytes rank 0 sends in "
                          f"one, peak MiB per rank of one (RSS above the rank's before the "
                          f"call, largest rank)", repeats),
                  ["ranks W", "ring ms", "context_parallel ms", "ring / context_parallel",
                   "bytes sent: ring / context_parallel", "peak MiB: ring / context_parallel",
                   "max rel. difference"])
    for world in (2, 4):
        results = run(torch_cp_worker, world, repeats, timeout=600)
        times, sent = results[0]["times"], results[0]["sent"]
        peaks = run(torch_cp_memory_worker, world, timeout=600)
        peak = {name: max(p[name] for p in peaks) for name in TORCH_CP}
        table.add(world, ms(times["ring"]), ms(times["context_parallel"]),
                  ratio(times["ring"], times["context_parallel"]),
                  f"{sent['ring']:,.0f} / {sent['context_parallel']:,.0f}",
                  f"{mib(peak['ring'])} / {mib(peak['context_parallel'])} "
                  f"({ratio(peak['ring'], peak['context_parallel'])})",
                  f"{max(r['diff'] for r in results):.1e}")
    table.emit("cp_torch")


ONLY_TORCH = "--context-parallel-only"


def main() -> None:
    only = ONLY_TORCH in sys.argv
    if only:
        sys.argv.remove(ONLY_TORCH)
    repeats = repeats_option(__doc__, default=10, debug_checks=False)
    if only:
        torch_cp_table(repeats)
        return
    table = Table(setting(f"attention over T={T} tokens, B={B}, H={H}, D={D}, float32 (K and "
                          f"V of the whole sequence: {mib(2 * B * H * T * D * 4)} MiB); ms per "
                          f"iteration (forward and backward); peak MiB per rank, ring / "
                          f"gather+SDPA (ratio), of the forward alone and of an iteration (RSS "
                          f"above the rank's before the call, largest rank)", repeats),
                  ["ranks W", "causal", "layout", "ring ms", "gather+SDPA ms",
                   "ring / gather+SDPA", "ring, no transfers / gather+SDPA", "forward MiB",
                   "iteration MiB", "max rel. difference"])
    for world in (2, 4):
        for layout, causal in CASES:
            results = run(cp_worker, world, layout, causal, repeats, timeout=600)
            times, diff = results[0]["times"], max(r["diff"] for r in results)
            peaks = run(cp_memory_worker, world, layout, causal, timeout=600)
            memory = {part: {name: max(p[part][name] for p in peaks) for name in CONTENDERS}
                      for part in ("forward", "iteration")}
            table.add(world, "yes" if causal else "no", layout,
                      *(ms(times[name]) for name in CONTENDERS),
                      ratio(times["ring"], times["gather+SDPA"]),
                      ratio(times["ring, no transfers"], times["gather+SDPA"]),
                      _pair(memory["forward"]),
                      _pair(memory["iteration"]), f"{diff:.1e}")
    table.emit("cp")
    torch_cp_table(repeats)


if __name__ == "__main__":
    main()
