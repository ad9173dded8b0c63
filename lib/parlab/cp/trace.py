r"""Ring attention in a profiler trace: compute and transfer ranges per step, and the overlap.

    from parlab.cp.trace import trace_ring, plot_ring_trace
    ring = trace_ring(world_size=4, seq_len=2048, trace="ring.json")
    ring.hidden            # {"overlapped": 0.97, "waits first": 0.0}: transfer time hidden
    ring.transfers[mode]   # per rank, each step's K/V transfer as a parlab.timeline.Range
    plot_ring_trace(ring)

One job on W ranks (`parlab.launch.run(..., trace=path)`) runs the reference ring
(`parlab.cp.ring`) with real blocks and real K/V messages: the forward twice, first
overlapped (each step posts its transfer, then computes), then waiting for each transfer
before computing, each inside a range named by its mode ("ring forward overlapped"); with
`backward=True` then one forward and backward through `ring_attention` ("ring
forward+backward", for the file: its steps are "ring backward step s ..."). Inside,
the ring's own ranges (`parlab.cp.ring`'s docstring: "ring step 1 send/recv", "ring step 1
compute", "ring step 1 wait") and gloo's, one "gloo:recv" per message from the moment the
receive was posted until the message arrived.

A step's transfer, on rank r: from the moment both ends had posted it (the later of rank r's
and its left neighbour's "ring step s send/recv") until the last of its messages (K, V)
arrived. Counting from rank r's own post would also count the time its neighbour, still
computing, had not sent yet. The hidden share of a mode: of all the ranks' transfer time,
the part they spent computing (`parlab.timeline.covered`). 1 means every transfer flew while
a block computed; 0 that the rank waited for each one.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch
import torch.distributed as dist
from torch.profiler import record_function

from parlab.cp.layout import position_table
from parlab.cp.ring import ring_attention, ring_attention_forward
from parlab.launch import device as launch_device
from parlab.launch import run
from parlab.timeline import Range, Timeline, covered, load

if TYPE_CHECKING:
    from matplotlib.figure import Figure  # pyplot is imported where it draws: ranks never do

__all__ = ["MODES", "TRANSFERS", "COMPUTE", "RingTrace", "step_transfers", "trace_ring",
           "plot_ring_trace"]

MODES = {"overlapped": True, "waits first": False}
TRANSFERS = r"^(gloo|nccl):recv( \d+<-\d+)?$"  # a message in flight, posted to arrived
# (NCCL names its peers: "nccl:recv 0<-1")
COMPUTE = r"^ring (backward )?step \d+ compute$"
WAIT = r"^ring step \d+ wait$"
_COLOURS = {"compute": "tab:blue", "in flight": "tab:orange", "waiting": "tab:red"}


@dataclass
class RingTrace:
    """`trace_ring`'s result: the merged trace read back and the hidden share per mode."""

    path: str
    timeline: Timeline
    world_size: int
    hidden: dict[str, float]  # mode -> share of the transfer time spent computing
    windows: dict[str, tuple[float, float]]  # mode -> (start, end) seconds in the trace
    transfers: dict[str, list[list[Range]]]  # mode -> per rank, one Range per step
    block_bytes: int  # K + V of one rank, one step


def _ring_worker(seq_len: int, heads: int, head_dim: int, causal: bool,
                 backward: bool) -> int:
    rank, world = dist.get_rank(), dist.get_world_size()
    device = launch_device()
    gen = torch.Generator().manual_seed(rank)
    n = seq_len // world
    q, k, v = (torch.randn(1, heads, n, head_dim, generator=gen).to(device) for _ in range(3))
    pos = position_table("zigzag" if causal else "contiguous", world, seq_len).to(device)
    ring_attention_forward(q, k, v, pos, causal=causal)  # warm-up, outside the ranges
    for mode, overlap in MODES.items():
        dist.barrier()
        with record_function(f"ring forward {mode}"):
            ring_attention_forward(q, k, v, pos, causal=causal, overlap=overlap)
    dist.barrier()
    if backward:
        q.requires_grad_()
        with record_function("ring forward+backward"):
            ring_attention(q, k, v, pos, causal=causal).sum().backward()
        dist.barrier()
    return 2 * k.numel() * k.element_size()


def step_transfers(tl: Timeline, window: tuple[float, float],
                   world_size: int) -> list[list[Range]]:
    """Per rank, each forward step's K/V transfer, posted at both ends to arrived."""
    out = []
    for rank in range(world_size):
        left, steps = (rank - 1) % world_size, []
        posts = tl.ranges(rank=rank, match=r"^ring step \d+ send/recv$", within=window)
        for post in posts:
            sent = next(r for r in tl.ranges(rank=left, within=window) if r.name == post.name)
            arrived = [r.end for r in tl.ranges(rank=rank, match=TRANSFERS, within=window)
                       if post.start <= r.start <= post.end]
            if not arrived:
                raise ValueError(f"rank {rank}: no {TRANSFERS!r} range inside {post}")
            start = max(post.start, sent.start)
            name = post.name.replace("send/recv", "transfer")
            steps.append(Range(rank, name, min(start, max(arrived)), max(arrived)))
        out.append(steps)
    return out


def trace_ring(*, world_size: int = 4, seq_len: int = 2048, heads: int = 4,
               head_dim: int = 64, causal: bool = False, backward: bool = False,
               trace: str | os.PathLike, timeout: float = 60.0) -> RingTrace:
    """Trace the ring on `world_size` ranks (module docstring); seq_len tokens in all."""
    if world_size < 2:
        raise ValueError(f"a ring needs 2 ranks or more to pass anything on, got {world_size}")
    sizes = run(_ring_worker, world_size, seq_len, heads, head_dim, causal, backward,
                trace=trace, timeout=timeout)
    tl = load(trace)
    windows = {mode: tl.span(f"ring forward {mode}") for mode in MODES}
    transfers = {mode: step_transfers(tl, windows[mode], world_size) for mode in MODES}
    hidden = {}
    for mode, window in windows.items():
        flying = [r for row in transfers[mode] for r in row]
        hidden[mode] = sum(covered([r], tl.ranges(rank=r.rank, match=COMPUTE, within=window))
                           for r in flying) / sum(r.seconds for r in flying)
    if backward:
        windows["forward+backward"] = tl.span("ring forward+backward")
    return RingTrace(str(trace), tl, world_size, hidden, windows, transfers, sizes[0])


def plot_ring_trace(ring: RingTrace, modes: tuple[str, ...] = tuple(MODES)) -> Figure:
    """One panel per mode: per rank, blocks computing, messages in flight, time blocked."""
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(len(modes), 1, figsize=(9, 1.0 + 1.3 * len(modes) *
                                                    ring.world_size ** 0.5),
                             sharex=True, layout="constrained", squeeze=False)
    for ax, mode in zip(axes[:, 0], modes, strict=True):
        start, end = ring.windows[mode]
        for rank in range(ring.world_size):
            lanes = {"compute": ring.timeline.ranges(rank=rank, match=COMPUTE, within=(start, end)),
                     "in flight": ring.transfers[mode][rank],
                     "waiting": ring.timeline.ranges(rank=rank, match=WAIT, within=(start, end))}
            for (kind, found), lane in zip(lanes.items(), (0.0, -0.3, 0.3), strict=True):
                ax.broken_barh([((r.start - start) * 1e3, r.seconds * 1e3) for r in found],
                               (rank + lane - 0.13, 0.26), facecolors=_COLOURS[kind],
                               alpha=0.6 if kind == "in flight" else 1.0)
        ax.set_yticks(range(ring.world_size), [f"rank {r}" for r in range(ring.world_size)])
        ax.set_ylim(ring.world_size - 0.5, -0.6)
        ax.set_title(f"{mode}: {ring.hidden[mode]:.0%} of the K/V transfer time hidden behind "
                     f"compute ({(end - start) * 1e3:.0f} ms in all)")
    handles = [plt.Rectangle((0, 0), 1, 1, color=c, alpha=0.6 if k == "in flight" else 1)
               for k, c in _COLOURS.items()]
    fig.legend(handles, ["ring step s compute (one block)", "K/V transfer: posted at both "
                         "ends to arrived", "ring step s wait (blocked)"],
               loc="outside lower center", ncols=3, fontsize="small")
    axes[-1, 0].set_xlabel("time since the mode's first range started (ms), from the trace")
    return fig
