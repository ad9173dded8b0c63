r"""Module 05's section 10: PyTorch's `context_parallel` beside a ring, measured on real ranks.

    compare_with_ring(world_size, ring=, ring_backward=) -> dict    (rank 0's view)
    comparison_table(rows) -> str                                   (markdown)
    plot_ring_vs_cp(rows) -> Figure
    causal_on_cpu() -> dict[str, str]

`compare_with_ring` runs, on W ranks (gloo on a CPU), the same seeded q, k, v and output
gradient (B, H, T, D), float64, through three things:
- one device: SDPA forward and backward on the whole sequence, in every rank;
- `context_parallel` (`parlab.cp.torch_cp.context_parallel_attention`, not causal, load
  balancing off), its collectives traced per phase by `functional_trace` and, to show what
  it misses, by `parlab.comm`'s tracer too;
- a ring on the contiguous layout: `ring` and `ring_backward` when given (the learner's
  exercises 2 and 3: `(q, k, v, pos, *, causal) -> (out, lse)` and `(q, k, v, out, lse,
  dout, pos, *, causal) -> (dq, dk, dv)`), else, or when they raise, the course's
  `parlab.cp.ring_attention_forward` / `ring_attention_backward`; traced by `parlab.comm`.
Each one's memory is tracked by PyTorch's MemTracker (torch.distributed._tools, as
`parlab.dp.measure`): the bytes of every storage alive on the rank while its forward and
backward run, their peak and what is still held between forward and backward.

`causal_on_cpu` asks for a causal mask under both CPU backends and returns what PyTorch says.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import Tensor

from parlab import comm
from parlab.cp import ring as cp_ring
from parlab.cp import torch_cp
from parlab.cp.compare import allgather_bytes_per_layer, ring_bytes_per_layer
from parlab.cp.layout import position_table
from parlab.launch import run

if TYPE_CHECKING:
    from matplotlib.figure import Figure

__all__ = ["compare_with_ring", "comparison_table", "plot_ring_vs_cp", "causal_on_cpu"]

SIZES = {"batch": 1, "heads": 4, "tokens_per_rank": 64, "head_dim": 16}


def _total(snapshot: dict) -> int:
    return int(sum(per_device.get("Total", 0) for per_device in snapshot.values()))


def _bytes(record: comm.Trace) -> tuple[float, int]:
    return record.wire_bytes(), record.count()


def _ring_step(ring: Callable | None, ring_backward: Callable | None, q: Tensor, k: Tensor,
               v: Tensor, dout: Tensor, pos: Tensor) -> tuple[list[Tensor], dict[str, Any]]:
    """The ring's forward and backward on this rank's tokens; which ring ran, its traces."""
    attempts = [("yours", ring, ring_backward)] if ring and ring_backward else []
    attempts.append(("the course's", cp_ring.ring_attention_forward,
                     cp_ring.ring_attention_backward))
    note = ""
    for who, forward, backward in attempts:
        from torch.distributed._tools.mem_tracker import MemTracker

        tracker = MemTracker()
        try:
            with tracker:
                with comm.trace() as fwd:
                    out, lse = forward(q, k, v, pos, causal=False)
                turn = _total(tracker.get_tracker_snapshot("current"))
                with comm.trace() as bwd:
                    grads = backward(q, k, v, out, lse, dout, pos, causal=False)
        except Exception as exc:  # noqa: BLE001 - the learner's ring: fall back, and say so
            note = f"your ring raised {type(exc).__name__}: {str(exc)[:120]}"
            continue
        peak = _total(tracker.get_tracker_snapshot("peak"))
        return [out, *grads], {"who": who, "note": note, "forward": _bytes(fwd),
                               "backward": _bytes(bwd), "turn": turn, "peak": peak}
    raise AssertionError("the course's ring raises nothing")


def _worker(ring: Callable | None, ring_backward: Callable | None, sizes: dict,
            seed: int) -> dict[str, Any]:
    from torch.distributed.device_mesh import init_device_mesh

    rank, world, dev = dist.get_rank(), dist.get_world_size(), torch_cp.cp_device()
    seq = sizes["tokens_per_rank"] * world
    gen = torch.Generator().manual_seed(seed)
    q, k, v, dout = full = [torch.randn(sizes["batch"], sizes["heads"], seq, sizes["head_dim"],
                                        generator=gen, dtype=torch.float64).to(dev)
                            for _ in range(4)]
    lq, lk, lv = leaves = [x.clone().requires_grad_() for x in (q, k, v)]
    with torch_cp.cp_sdpa(dev):
        one = F.scaled_dot_product_attention(lq, lk, lv)
    one.backward(dout)
    single = [one.detach()] + [x.grad for x in leaves if x.grad is not None]  # one device
    mesh = init_device_mesh(dev.type, (world,), mesh_dim_names=("cp",))
    phases: dict[str, comm.Trace] = {}
    memory: dict[str, int] = {}
    with comm.trace() as seen_by_parlab:
        cp = torch_cp.context_parallel_attention(q, k, v, dout, mesh, phases=phases,
                                                 memory=memory)
    pos = position_table("contiguous", world, seq)
    mq, mk, mv, md = [x[..., pos[rank], :].contiguous() for x in full]
    ring_out, ran = _ring_step(ring, ring_backward, mq, mk, mv, md, pos.to(dev))

    def diff(a: Sequence[Tensor], b: Sequence[Tensor]) -> float:
        return max(float((x.double() - y.double()).abs().max()) for x, y in zip(a, b, strict=True))

    features, size = sizes["heads"] * sizes["head_dim"], full[0].element_size()
    return {"world": world, "tokens": seq, "who": ran["who"], "note": ran["note"],
            "ring_model": ring_bytes_per_layer(sizes["batch"], seq, features, world, size,
                                               backward=True),
            "cp_model": allgather_bytes_per_layer(sizes["batch"], seq, features, world, size,
                                                  backward=True, regather=True),
            "cp_vs_one": diff(cp, single),
            "ring_vs_one": diff(ring_out, [x[..., pos[rank], :] for x in single]),
            "cp_vs_ring": diff([x[..., pos[rank], :] for x in cp], ring_out),
            "cp": {name: _bytes(phases[name]) for name in ("forward", "backward", "unshard")},
            "cp_kinds": sorted({e.kind for p in phases.values() for e in p.events}),
            "parlab_comm_saw": seen_by_parlab.count(), "cp_peak": memory["peak"],
            "ring": {"forward": ran["forward"], "backward": ran["backward"]},
            "ring_peak": ran["peak"], "block_bytes": mk.numel() * mk.element_size()}


def compare_with_ring(world_size: int, *, ring: Callable | None = None,
                      ring_backward: Callable | None = None, sizes: dict | None = None,
                      seed: int = 0, timeout: float = 120.0) -> dict[str, Any]:
    """Rank 0's measurements (module docstring): largest differences "cp_vs_one",
    "ring_vs_one", "cp_vs_ring"; bytes rank 0 sent, (bytes, calls) per phase, "cp"
    (forward, backward, unshard) and "ring" (forward, backward); "cp_kinds"; what
    parlab.comm saw of context_parallel ("parlab_comm_saw"); the closed forms of forward +
    backward bytes, "ring_model" (`ring_bytes_per_layer`, 6W - 4 K blocks) and "cp_model"
    (`allgather_bytes_per_layer` with the backward's second all-gather, 6(W - 1)); MemTracker
    peaks "cp_peak", "ring_peak"; "block_bytes" (one rank's K); "who" ran the ring."""
    torch_cp.share_cp_options()
    return run(_worker, world_size, ring, ring_backward, {**SIZES, **(sizes or {})}, seed,
               timeout=timeout)[0]


def comparison_table(rows: Sequence[dict]) -> str:
    """A markdown table of `compare_with_ring` rows."""
    lines = ["| W | ring | largest difference: CP / ring vs one device, CP vs ring | "
             "bytes sent by rank 0, forward + backward: ring / CP | CP's collectives "
             "(parlab.comm saw) | peak memory per rank, ring / CP |", "|---|---|---|---|---|---|"]
    for r in rows:
        ring_b = r["ring"]["forward"][0] + r["ring"]["backward"][0]
        cp_b = r["cp"]["forward"][0] + r["cp"]["backward"][0]
        calls = sum(r["cp"][p][1] for p in ("forward", "backward"))
        lines.append(f"| {r['world']} | {r['who']} | {r['cp_vs_one']:.0e} / "
                     f"{r['ring_vs_one']:.0e}, {r['cp_vs_ring']:.0e} | {ring_b:,.0f} / "
                     f"{cp_b:,.0f} | {calls} ({r['parlab_comm_saw']}) | "
                     f"{r['ring_peak']:,} / {r['cp_peak']:,} B |")
    return "\n".join(lines)


def plot_ring_vs_cp(rows: Sequence[dict]) -> Figure:
    """Per W: bytes rank 0 sends (forward and backward stacked) and its peak memory, the
    ring's bar beside context_parallel's, in units of one rank's K block."""
    import matplotlib.pyplot as plt

    fig, (sent, held) = plt.subplots(1, 2, figsize=(10, 3.6), layout="constrained")
    width = 0.38
    for i, r in enumerate(rows):
        unit = r["block_bytes"]
        for j, (key, colour) in enumerate((("ring", "tab:blue"), ("cp", "tab:orange"))):
            x = i + (j - 0.5) * width
            fwd, bwd = r[key]["forward"][0] / unit, r[key]["backward"][0] / unit
            sent.bar(x, fwd, width, color=colour, label=None if i else
                     ("ring" if j == 0 else "context_parallel (CPU)") + ", forward")
            sent.bar(x, bwd, width, bottom=fwd, color=colour, alpha=0.45, label=None if i else
                     ("ring" if j == 0 else "context_parallel (CPU)") + ", backward")
            held.bar(x, r[f"{key}_peak"] / unit, width, color=colour)
            sent.hlines(r[f"{key}_model"] / unit, x - width / 2, x + width / 2, color="black",
                        label=None if i or j else "closed form (parlab.cp.compare)")
    for ax in (sent, held):
        ax.set_xticks(range(len(rows)), [f"W = {r['world']}" for r in rows])
    sent.set_ylabel("K blocks sent by rank 0")
    sent.set_title("bytes a rank sends, forward + backward")
    held.set_ylabel("K blocks")
    held.set_title("peak memory of a rank (MemTracker)")
    sent.legend(fontsize="small")
    return fig


def _causal_worker() -> dict[str, str]:
    from torch.distributed.device_mesh import init_device_mesh
    from torch.nn.attention import SDPBackend

    world = dist.get_world_size()
    mesh = init_device_mesh("cpu", (world,), mesh_dim_names=("cp",))
    q, k, v, dout = (torch.randn(1, 2, 4 * world, 8, dtype=torch.float64) for _ in range(4))
    said = {}
    for name, backend in (("math", SDPBackend.MATH), ("CPU flash", SDPBackend.FLASH_ATTENTION)):
        try:
            torch_cp.context_parallel_attention(q, k, v, dout, mesh, causal=True,
                                                backends=[backend])
            said[name] = "ran"
        except Exception as exc:  # noqa: BLE001 - what PyTorch says is the result
            said[name] = f"{type(exc).__name__}: {str(exc).splitlines()[0][:160]}"
    return said


def causal_on_cpu(world_size: int = 2) -> dict[str, str]:
    """backend -> what context_parallel did with a causal mask on CPU ranks."""
    return run(_causal_worker, world_size, timeout=60.0)[0]
