r"""Measurements of module 05: does the ring hide its transfers, and who does the causal work.

`measure_overlap` runs the reference ring (`parlab.cp.ring`) on W ranks with real K/V
transfers (gloo isend/irecv) under controlled costs, so that the result does not depend on
what else the machine is doing:

- a block computes by sleeping `cost` seconds (a known compute; a sleeping rank leaves the
  CPU to the transfers);
- a link of known speed: the wait on a step's transfer returns no earlier than `link`
  seconds after the transfer was posted (and never before the real message has arrived).

It first calibrates: a ring that computes nothing and waits for each transfer measures the
real time to ship one block, x (median over steps and repeats, the largest over ranks);
link = 1.25 x, within [min_link, max_link], unless given: just above what the real messages
need (the cap bounds the run on a very busy machine); and
cost = max(factor * link, min_cost) unless given, so compute dominates. Then, best of
`repeats` (the slowest rank of each run):

    overlapped ring: about W * cost               (each transfer flies while a block computes)
    waits first:     about W * cost + (W-1) link  (each transfer is waited for, then computed)

`measure_work` runs the causal ring under each layout and counts, from the masks the blocks
actually evaluated, the score entries each rank computed at each step.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

import torch
import torch.distributed as dist
from torch import Tensor

from parlab.cp import ring as cp_ring
from parlab.cp.blocks import block_attention, empty_partial, full_attention
from parlab.cp.layout import LAYOUTS, position_table
from parlab.cp.ring import ring_attention_forward
from parlab.launch import device, run, synchronize

if TYPE_CHECKING:
    from matplotlib.figure import Figure  # pyplot is imported where it draws: ranks never do

__all__ = ["measure_overlap", "measure_work", "plot_timelines"]

MODES = {"overlapped": True, "waits first": False}
Events = list[tuple[str, float, float]]  # ("compute" | "transfer" | "wait", start, end)


class _TimedTransfer:
    """A posted ring step whose wait returns no earlier than `link` s after posting."""

    def __init__(self, real: cp_ring.Transfer, link: float, events: Events,
                 origin: float) -> None:
        self.real, self.link, self.events, self.origin = real, link, events, origin
        self.posted = time.perf_counter()
        self.received: list[Tensor] | None = None

    def wait(self) -> list[Tensor]:
        if self.received is not None:  # waited for already (the ring may ask twice)
            return self.received
        start = time.perf_counter()
        self.received = self.real.wait()
        synchronize()  # under NCCL wait() returns once queued; the transfer ends when it is done
        time.sleep(max(0.0, self.posted + self.link - time.perf_counter()))
        end = time.perf_counter() - self.origin
        self.events += [("transfer", self.posted - self.origin, end),
                        ("wait", start - self.origin, end)]
        return self.received


def _one_ring(kv: tuple[Tensor, Tensor], cost: float, link: float,
              overlap: bool) -> tuple[float, Events]:
    """One timed forward; returns (the slowest rank's seconds, this rank's events)."""
    k, v = kv
    world = dist.get_world_size()
    q = torch.zeros(1, k.shape[1], 1, k.shape[-1], device=k.device)  # the sleeper ignores it
    pos = torch.zeros(world, 1, dtype=torch.int64)
    events: Events = []

    def attend(*args: Any, causal: bool) -> tuple[Tensor, Tensor]:
        start = time.perf_counter()
        time.sleep(cost)  # a block of known cost, adding nothing: out 0, lse -inf
        events.append(("compute", start - origin, time.perf_counter() - origin))
        return empty_partial(q)

    def shift(tensors: Sequence[Tensor], *, group: Any = None) -> _TimedTransfer:
        return _TimedTransfer(cp_ring.shift_right(tensors, group=group), link, events, origin)

    dist.barrier()
    origin = time.perf_counter()
    ring_attention_forward(q, k, v, pos, causal=False, overlap=overlap, attend=attend,
                           shift=shift)
    synchronize()
    took = torch.tensor([time.perf_counter() - origin], dtype=torch.float64, device=k.device)
    dist.all_reduce(took, op=dist.ReduceOp.MAX)
    return float(took), events


def _overlap_worker(tokens: int, heads: int, head_dim: int, cost: float | None,
                    link: float | None, factor: float, min_cost: float,
                    link_range: tuple[float, float], repeats: int) -> dict:
    gen = torch.Generator().manual_seed(dist.get_rank())
    k, v = (torch.randn(1, heads, tokens, head_dim, generator=gen).to(device())
            for _ in range(2))  # K and V, (1, H, n, D) each
    kv = (k, v)
    waits = []
    for _ in range(repeats):  # calibration: compute nothing, wait for every real transfer
        waits += [end - start for kind, start, end in _one_ring(kv, 0.0, 0.0, False)[1]
                  if kind == "transfer"]
    shipped = torch.tensor([statistics.median(waits) if waits else 0.0], dtype=torch.float64,
                           device=kv[0].device)
    dist.all_reduce(shipped, op=dist.ReduceOp.MAX)
    lo, hi = link_range
    link_s = link if link is not None else min(max(1.25 * float(shipped), lo), hi)
    cost_s = cost if cost is not None else max(factor * link_s, min_cost)
    out: dict[str, Any] = {"transfer_s": float(shipped), "link_s": link_s, "cost_s": cost_s,
                           "runs": {}, "timeline": {},
                           "bytes": 2 * kv[0].numel() * kv[0].element_size()}
    for name, overlap in MODES.items():
        runs = [_one_ring(kv, cost_s, link_s, overlap) for _ in range(repeats)]
        best = min(range(repeats), key=lambda i: runs[i][0])
        out["runs"][name] = [r[0] for r in runs]
        out["timeline"][name] = runs[best][1]
    return out


def measure_overlap(*, world_size: int = 4, tokens: int = 2048, heads: int = 4,
                    head_dim: int = 64, block_cost: float | None = None,
                    link_time: float | None = None, factor: float = 2.5,
                    min_cost: float = 0.03, min_link: float = 0.02, max_link: float = 0.06,
                    repeats: int = 3, timeout: float = 60.0) -> dict:
    """Overlapped vs waits-first ring, real transfers, known costs (module docstring).

    Returns {"world_size", "bytes" (K+V per step), "transfer_s" (x, measured), "link_s",
    "cost_s", "compute_s" (W * cost), "model" {mode: s}, "best" {mode: s}, "runs"
    {mode: [s]}, "timelines" {mode: [rank events]}}.
    """
    ranks = run(_overlap_worker, world_size, tokens, heads, head_dim, block_cost, link_time,
                factor, min_cost, (min_link, max_link), repeats, timeout=timeout)
    first, w = ranks[0], world_size
    compute, link = w * first["cost_s"], first["link_s"]
    return {"world_size": w, "bytes": first["bytes"], "transfer_s": first["transfer_s"],
            "link_s": link, "cost_s": first["cost_s"], "compute_s": compute,
            "model": {"overlapped": compute, "waits first": compute + (w - 1) * link},
            "runs": first["runs"], "best": {m: min(v) for m, v in first["runs"].items()},
            "timelines": {m: [r["timeline"][m] for r in ranks] for m in MODES}}


def _work_worker(layouts: tuple[str, ...], seq_len: int, tables: dict[str, Tensor],
                 seed: int) -> dict:
    rank, world = dist.get_rank(), dist.get_world_size()
    gen = torch.Generator().manual_seed(seed)
    q, k, v = (torch.randn(1, 2, seq_len, 8, generator=gen, dtype=torch.float64).to(device())
               for _ in range(3))  # (B, H, T, D), the same on every rank
    full, _ = full_attention(q, k, v, causal=True)
    out = {}
    for layout in layouts:
        pos = tables[layout]
        counts = torch.zeros(world, dtype=torch.int64)

        def attend(qb: Tensor, kb: Tensor, vb: Tensor, q_pos: Tensor, k_pos: Tensor, *,
                   causal: bool, pos: Tensor = pos, counts: Tensor = counts
                   ) -> tuple[Tensor, Tensor]:
            src = next(r for r in range(world) if torch.equal(pos[r], k_pos))
            counts[(rank - src) % world] += int((k_pos[None, :] <= q_pos[:, None]).sum())
            return block_attention(qb, kb, vb, q_pos, k_pos, causal=causal)

        mine = pos[rank]
        got, _ = ring_attention_forward(q[..., mine, :], k[..., mine, :], v[..., mine, :], pos,
                                        causal=True, attend=attend)
        out[layout] = {"steps": counts,
                       "error": float((got - full[..., mine, :]).abs().max())}
    return out


def measure_work(*, world_size: int = 4, seq_len: int = 64,
                 layouts: tuple[str, ...] = LAYOUTS,
                 layout_fn: Callable[..., Tensor] | None = None, seed: int = 0,
                 timeout: float = 60.0) -> dict:
    """Causal ring under each layout: {layout: {"steps": (W, W) [rank, step] entries counted
    from the masks evaluated, "per_rank": (W,), "error": largest |out - full attention|}}."""
    tables = {name: (position_table(name, world_size, seq_len) if layout_fn is None else
                     torch.stack([torch.as_tensor(layout_fn(name, r, world_size, seq_len))
                                  for r in range(world_size)]).long()) for name in layouts}
    ranks = run(_work_worker, world_size, tuple(layouts), seq_len, tables, seed,
                timeout=timeout)
    result = {}
    for name in layouts:
        steps = torch.stack([r[name]["steps"] for r in ranks])  # (W, W)
        result[name] = {"steps": steps, "per_rank": steps.sum(1),
                        "error": max(r[name]["error"] for r in ranks), "table": tables[name]}
    return result


_COLOURS = {"compute": "tab:blue", "transfer": "tab:orange", "wait": "tab:red"}


def plot_timelines(result: dict) -> Figure:
    """One panel per mode: per rank, compute bars, transfers in flight and time blocked."""
    import matplotlib.pyplot as plt

    modes = list(result["timelines"])
    fig, axes = plt.subplots(len(modes), 1, figsize=(8.5, 1.2 + 1.1 * len(modes) *
                                                      result["world_size"] ** 0.5),
                             sharex=True, layout="constrained")
    for ax, mode in zip(axes, modes, strict=True):
        for rank, events in enumerate(result["timelines"][mode]):
            for kind, start, end in events:
                lane = {"compute": 0.0, "transfer": 0.3, "wait": 0.3}[kind]
                ax.barh(rank + lane, (end - start) * 1e3, left=start * 1e3,
                        height=0.28 if kind == "compute" else 0.18, color=_COLOURS[kind],
                        alpha=0.55 if kind == "transfer" else 1.0)
        ax.axvline(result["compute_s"] * 1e3, color="black", linestyle="--", linewidth=1)
        ax.set_yticks(range(result["world_size"]),
                      [f"rank {r}" for r in range(result["world_size"])])
        ax.invert_yaxis()
        ax.set_title(f"{mode}: {result['best'][mode] * 1e3:.0f} ms measured, model "
                     f"{result['model'][mode] * 1e3:.0f} ms (compute alone "
                     f"{result['compute_s'] * 1e3:.0f} ms, dashed)")
    handles = [plt.Rectangle((0, 0), 1, 1, color=c, alpha=0.55 if k == "transfer" else 1)
               for k, c in _COLOURS.items()]
    fig.legend(handles, ["block compute (known cost)", "K/V transfer in flight (real message, "
                         "known link)", "blocked waiting for it"], loc="outside lower center",
               ncols=3, fontsize="small")
    axes[-1].set_xlabel("time since the ring started on that rank (ms)")
    return fig
