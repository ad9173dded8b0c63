"""The GPU check's part 4 (scripts/gpu_check.py): PyTorch's context_parallel against the
course's ring attention, on NCCL.

With two GPUs or more, on W = min(GPUs, 4) ranks (`parlab.launch.run`, NCCL), the same seeded
q, k, v and output gradient (B, H, T, D), float32, go through
- `parlab.cp.torch_cp.context_parallel_attention` under SDPA's flash, efficient and cuDNN
  kernels, which context_parallel turns into PyTorch's ring (`_templated_ring_attention`):
  causal with load balancing (the head-tail layout) and not causal without it, K/V rotated by
  "allgather" and by "alltoall";
- the course's reference ring, `parlab.cp.ring_attention`, forward and backward, on the same
  layout (zigzag for causal, which is the head-tail order; contiguous otherwise);
- attention on one device (softmax written out in float64, autograd for the gradients).
One row per case: pass when the output and dq, dk, dv of both agree with one device (and so
with each other) within TOLERANCE, with the bytes each sent from rank 0 (DTensor's functional
collectives through `functional_trace`, the ring's sends through `parlab.comm`); FAIL with the
largest difference otherwise. On a CPU, or with one GPU, the part is SKIPPED and says why;
`cp_rows(..., device_ok=True)` runs the same job on gloo CPU ranks, where context_parallel
all-gathers K and V instead and refuses a causal mask (tests/test_gpu_check.py).
"""

from __future__ import annotations

import math
import sys
import time
from typing import Any

import cloudpickle
import torch
import torch.distributed as dist

from parlab import comm
from parlab.cp import position_table, ring_attention, torch_cp
from parlab.launch import run

CASES = [(causal, rotate) for causal in (False, True) for rotate in ("allgather", "alltoall")]
B, H, D, TOKENS = 2, 4, 64, 256  # tokens per rank
TOLERANCE = 2e-4  # float32 kernels against a float64 softmax, relative to the largest value
JOB_S = 120.0
ITEM = "05_context_parallel (context_parallel vs parlab.cp ring, {what})"

if __name__ in sys.modules and __name__ != "__main__":  # imported: ranks cannot import it
    cloudpickle.register_pickle_by_value(sys.modules[__name__])


def _reference(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, dout: torch.Tensor,
               causal: bool) -> list[torch.Tensor]:
    """out, dq, dk, dv of softmax attention on one device, float64, on the CPU."""
    leaves = [x.detach().double().cpu().requires_grad_() for x in (q, k, v)]
    s = leaves[0] @ leaves[1].transpose(-2, -1) / math.sqrt(q.shape[-1])
    if causal:
        t = q.shape[2]
        s = s.masked_fill(torch.ones(t, t, dtype=torch.bool).triu(1), float("-inf"))
    out = torch.softmax(s, dim=-1) @ leaves[2]
    out.backward(dout.double().cpu())
    return [out.detach()] + [x.grad for x in leaves if x.grad is not None]


def cp_job(causal: bool, rotate: str, tokens: int) -> dict[str, Any]:
    """In each rank: both ways on the same tensors; rank 0 compares them with one device."""
    from torch.distributed.device_mesh import init_device_mesh

    rank, world, dev = dist.get_rank(), dist.get_world_size(), torch_cp.cp_device()
    seq = tokens * world
    gen = torch.Generator().manual_seed(5)
    q, k, v, dout = (torch.randn(B, H, seq, D, generator=gen).to(dev) for _ in range(4))
    mesh = init_device_mesh(dev.type, (world,), mesh_dim_names=("cp",))
    phases: dict[str, comm.Trace] = {}
    out: dict[str, Any] = {}
    try:
        cp = torch_cp.context_parallel_attention(q, k, v, dout, mesh, causal=causal,
                                                 rotate=rotate, phases=phases)
    except Exception as exc:  # noqa: BLE001 - what PyTorch refuses is the row's verdict
        out["refused"] = f"{type(exc).__name__}: {str(exc).splitlines()[0][:120]}"
        cp = None
    pos = position_table("zigzag" if causal else "contiguous", world, seq)
    mine = [x[..., pos[rank], :].detach().clone().requires_grad_() for x in (q, k, v)]
    with comm.trace() as sent:
        ring_out = ring_attention(*mine, pos.to(dev), causal=causal)
        ring_out.backward(dout[..., pos[rank], :])
    ring = [ring_out.detach()] + [x.grad for x in mine if x.grad is not None]
    parts = [[torch.empty_like(x) for _ in range(world)] for x in ring]
    for bucket, x in zip(parts, ring, strict=True):
        dist.all_gather(bucket, x.contiguous())  # every rank's pieces, for rank 0
    if rank != 0:
        return {}
    order = torch.argsort(pos.flatten())
    ring_full = [torch.cat(b, dim=2)[..., order.to(dev), :].cpu() for b in parts]
    want = _reference(q, k, v, dout, causal)
    scale = max(float(w.abs().max()) for w in want)
    out["ring_diff"] = max(float((g.double() - w).abs().max()) for g, w in
                           zip(ring_full, want, strict=True)) / scale
    out["ring_bytes"] = sent.wire_bytes()
    if cp is not None:
        out["cp_diff"] = max(float((g.cpu().double() - w).abs().max()) for g, w in
                             zip(cp, want, strict=True)) / scale
        out["cp_bytes"] = sum(p.wire_bytes() for name, p in phases.items() if name != "unshard")
        out["cp_kinds"] = sorted({e.kind for p in phases.values() for e in p.events})
    return out


def verdict(res: dict[str, Any], causal: bool) -> str:
    """The row's result: pass, FAIL, or SKIPPED (context_parallel refused the case here)."""
    ring = f"ring {res['ring_diff']:.1e} ({res['ring_bytes']:,.0f} B)"
    if "refused" in res:
        return (f"SKIPPED: context_parallel refused it here ({res['refused']}); {ring}"
                if causal else f"FAIL: context_parallel raised {res['refused']}")
    worst = max(res["cp_diff"], res["ring_diff"])
    word = "pass" if worst <= TOLERANCE else "FAIL"
    return (f"{word}: largest difference from one device, relative: context_parallel "
            f"{res['cp_diff']:.1e} ({res['cp_bytes']:,.0f} B sent by rank 0, "
            f"{', '.join(res['cp_kinds'])}), {ring}")


def cp_rows(gpus: int, deadline: float, *, device_ok: bool | None = None,
            world: int | None = None, tokens: int = TOKENS,
            cases: list[tuple[bool, str]] = CASES) -> list[tuple[str, str, str, str]]:
    """Rows of this part: one per case, (causal, rotate method); SKIPPED, with why, without
    two GPUs (`device_ok=True` runs the job anyway, on whatever `parlab.launch.run` picks:
    gloo CPU ranks on a machine without GPUs)."""
    ok = (torch.cuda.is_available() and gpus >= 2) if device_ok is None else device_ok
    rows = []
    for causal, rotate in cases:
        what = f"{'causal' if causal else 'not causal'}, rotate {rotate}"
        item = ITEM.format(what=what)
        left = deadline - time.monotonic()
        if not ok or left < 10:
            why = ("context_parallel runs a ring only on CUDA, and this needs 2 GPUs or more "
                   f"({gpus} here): on a CPU it all-gathers K and V, and refuses a causal mask"
                   if not ok else "out of time budget")
            rows.append(("context parallel", item, f"SKIPPED: {why}", ""))
            continue
        start = time.perf_counter()
        try:
            res = run(cp_job, world or min(gpus, 4) or 2, causal, rotate, tokens,
                      timeout=min(JOB_S, left))[0]
            result = verdict(res, causal)
        except Exception as exc:  # noqa: BLE001 - a failed job is the row's FAIL
            result = f"FAIL: {type(exc).__name__}: {str(exc).splitlines()[0][:200]}"
        rows.append(("context parallel", item, result, f"{time.perf_counter() - start:.1f}"))
    return rows
