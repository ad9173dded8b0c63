"""The GPU check's part 3 (scripts/gpu_check.py): one profiler trace per module.

A small job of each module's parallelism (module 00's collectives; one training step of
`parlab.compose` laid out as that module splits the model: DP, TP, TP+SP, PP, CP, EP, then
DP × PP × TP) through `parlab.launch.run(..., trace=)`, NCCL on a GPU box (the trace then
holds the GPUs' kernels beside the CPU ranges), gloo on a CPU (tests/test_gpu_check_traces.py).
"""

from __future__ import annotations

import shutil
import sys
import tempfile
import time
from collections.abc import Collection
from pathlib import Path

import cloudpickle
import torch
import torch.distributed as dist
from torch.profiler import record_function

from parlab import launch
from parlab.compose import Checkpoints, Plan, train
from parlab.launch import run
from parlab.model import LlamaConfig
from parlab.timeline import load

ROOT = Path(__file__).resolve().parents[1]
TRACE_S = 60.0  # the most one traced job may take
COLLECTIVE_BYTES = 2**22  # 4 MiB per collective in module 00's trace

if __name__ in sys.modules and __name__ != "__main__":  # imported: ranks cannot import it
    cloudpickle.register_pickle_by_value(sys.modules[__name__])


def traced_collectives(nbytes: int) -> int:
    """Module 00's job: one of each collective, each inside a range named after it."""
    device = launch.device()
    world = dist.get_world_size()
    x = torch.ones(nbytes // 4, device=device)
    out = torch.empty(world * x.numel(), device=device)
    for name, call in (("all_reduce", lambda: dist.all_reduce(x)),
                       ("all_gather", lambda: dist.all_gather_into_tensor(out, x)),
                       ("reduce_scatter", lambda: dist.reduce_scatter_tensor(x, out)),
                       ("broadcast", lambda: dist.broadcast(x, src=0))):
        with record_function(f"{name} {nbytes / 2**20:g} MiB"):
            call()
    if device.type == "cuda":
        torch.cuda.synchronize()
    return dist.get_rank()


def traced_step(cfg: LlamaConfig, plan: Plan) -> int:
    """Modules 01-07's job: one training step of the tiny Llama under `plan`."""
    train(cfg, plan, 1, lr=3e-3)
    return dist.get_rank()


def traced_checkpoint(cfg: LlamaConfig, plan: Plan) -> int:
    """Module 09's job: two steps that save a distributed checkpoint after each, then one more
    resumed from it (torch.distributed.checkpoint), in a folder rank 0 makes and removes."""
    folder = [tempfile.mkdtemp(prefix="parlab-gpu-ckpt-") if dist.get_rank() == 0 else None]
    dist.broadcast_object_list(folder, src=0)
    train(cfg, plan, 2, lr=3e-3, checkpoints=Checkpoints(save=folder[0], interval=1))
    train(cfg, plan, 3, lr=3e-3, checkpoints=Checkpoints(load=folder[0]))
    dist.barrier()
    if dist.get_rank() == 0:
        shutil.rmtree(str(folder[0]), ignore_errors=True)
    return dist.get_rank()


def trace_jobs(world: int) -> dict[str, tuple]:
    """Per module: (job, its arguments, ranks) on `world` ranks (1 or 2); module 07's DP × PP
    × TP takes 4 and module 08's DP × PP × TP+SP 8 (NCCL where there are that many GPUs, else
    gloo on the CPU)."""
    dense, moe = LlamaConfig(), LlamaConfig(moe_layers=(1,))
    if world == 1:
        return {"one GPU": (traced_step, (dense, Plan()), 1)}
    step = {"01_memory_and_sharding": Plan(dp=world), "02_tensor_parallel": Plan(tp=world),
            "03_sequence_parallel": Plan(tp=world, sequence_parallel=True),
            "04_pipeline_parallel": Plan(pp=world), "05_context_parallel": Plan(cp=world)}
    jobs = {"00_collectives": (traced_collectives, (COLLECTIVE_BYTES,), world)}
    jobs |= {module: (traced_step, (dense, plan), world) for module, plan in step.items()}
    jobs["06_expert_parallel"] = (traced_step, (moe, Plan(ep=world)), world)
    jobs["07_composition"] = (traced_step, (dense, Plan(pp=2, tp=2)), 4)
    jobs["08_the_whole_machine"] = (traced_step, (dense, Plan(
        dp=2, pp=2, tp=2, sequence_parallel=True, global_batch_size=8)), 8)
    jobs["09_checkpoints_and_restarts"] = (traced_checkpoint, (dense, Plan(
        dp=world, distributed_optimizer=True)), world)
    return jobs


def trace_part(gpus: int, folder: Path, deadline: float, *, world: int | None = None,
               modules: Collection[str] | None = None) -> list:
    """Rows of part 3: one traced job per module (those named in `modules`, or all), written
    to folder/<module>.json; `world` overrides the number of ranks (tests run 2 on a CPU)."""
    folder.mkdir(parents=True, exist_ok=True)
    rows = []
    for module, (job, args, ranks) in trace_jobs(world or min(gpus, 2)).items():
        if modules is not None and module not in modules:
            continue
        if deadline - time.monotonic() < 10:
            rows.append(("traces", module, "SKIPPED: out of time budget", ""))
            continue
        path, start = folder / f"{module}.json", time.perf_counter()
        try:
            run(job, ranks, *args, trace=path, timeout=TRACE_S)
            tl = load(path)
            kernels = sum(e.get("cat") == "kernel" for e in tl.events)
            verdict = "pass" if tl.ranks == list(range(ranks)) else "FAIL: a rank has no row"
            where = path.relative_to(ROOT) if path.is_relative_to(ROOT) else path
            detail = (f"{verdict}: {ranks} rank rows, {len(tl.ranges())} ranges, {kernels} "
                      f"CUDA kernels -> {where}")
        except Exception as exc:  # noqa: BLE001 - one row per module, the check goes on
            detail = f"FAIL: {type(exc).__name__}: {str(exc)[:200]}"
        rows.append(("traces", module, detail, f"{time.perf_counter() - start:.1f}"))
    return rows
