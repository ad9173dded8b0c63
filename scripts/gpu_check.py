"""The GPU check: a roofline of this card, then every module's solution notebook on NCCL.

    scripts/gpu_check.sh        or        .venv/bin/python scripts/gpu_check.py [--budget 480]

1. One GPU, a roofline lab: median time of square matmuls (bf16 and fp32, TF32 off, a few
   sizes) and of a large copy within the card's memory, turned into FLOP/s, bytes/s and the
   ridge, the FLOP-per-byte threshold of module 00 (`parlab.costs.roofline`, `parlab.costs`); with
   two GPUs also a copy from GPU 0 to GPU 1, the link between them. Module 00's verdicts for
   tensor and data parallelism follow, for each link, at the measured peak.
2. Two GPUs or more: each module's solution notebook (solutions/*/*.ipynb, hidden tests
   included) runs in a fresh kernel as the autograder runs it (`parlab.grading.
   execute_notebook`, in a temporary copy of its folder) with NCCL's rules on
   (PARLAB_NCCL_RULES=1); `parlab.launch.run` then picks NCCL for every run of at most as many
   ranks as GPUs. Then the capstone (scripts/capstone.py, DP 2 × TP 2) and module 08's
   scripts/train.py (TP 2 × PP 2 × DP, SP) under torchrun, both with --check against one
   device. Pass means no cell raised (a script: exit 0). Each gets at most NOTEBOOK_S seconds
   and the whole check `--budget` seconds: one still running is killed with everything it
   started, and what the budget cannot reach is SKIPPED (which counts as not passed). With one
   GPU these rows are SKIPPED with the reason: ranks sharing one GPU over gloo are not built.
3. One profiler trace per module (`trace_part`): a small job of that module's parallelism
   (module 00's collectives; one training step of `parlab.compose` laid out as that module
   splits the model: DP, TP, TP+SP, PP, CP, EP, then DP × PP × TP) run through
   `parlab.launch.run(..., trace=)` on two ranks, NCCL, so that the trace holds the GPUs'
   kernels and copies beside the CPU ranges (`parlab.timeline.profiled(cuda=True)`). Each
   lands in artifacts/traces/<module>.json, for Perfetto; its row counts the ranks' rows, the
   ranges and the CUDA kernels. With one GPU only a one-rank step is traced.
4. One summary table (markdown), printed and written to artifacts/gpu_check.md, then one
   line per module: passed, FAILED with its first error, or SKIPPED with why.

On a machine without CUDA it says what it needs and exits 0. Otherwise the exit status is 1
when a notebook failed or was skipped for time, else 0.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Collection
from pathlib import Path

import cloudpickle
import torch
import torch.distributed as dist
from torch.profiler import record_function

from parlab import costs, launch
from parlab.compose import Checkpoints, Plan, train
from parlab.costs.roofline import (
    Timing,
    copy_bytes,
    link_rows,
    matmul_flops,
    module_verdicts,
    roofline_rows,
    summary_table,
    timing_row,
)
from parlab.grading import SOLUTIONS_DIR, kill_kernel_tree, list_modules
from parlab.launch import run
from parlab.model import LlamaConfig
from parlab.timeline import load

ROOT = Path(__file__).resolve().parents[1]
NO_GPU = ("The GPU check needs CUDA, and this machine has none: nothing to measure. On a GPU "
          "box (two GPUs or more for the notebook part) run `scripts/gpu_check.sh` from the "
          "repository root after `make setup`, which installs a CUDA build of torch there.")
MATMUL_SIZES = (2048, 4096, 8192)
COPY_BYTES = 2**30  # 1 GiB within one GPU
PEER_BYTES = 2**28  # 256 MiB from GPU 0 to GPU 1
NOTEBOOK_S = 120.0  # the most one notebook may take
CELL_S = 60.0  # per cell, as autograder/nbgrader_config.py's Execute.timeout
KILL_ENV = "PARLAB_GPU_CHECK"
RUN_NOTEBOOK = """
import json, sys
from parlab.grading import cell_error, execute_notebook
nb = execute_notebook(sys.argv[1], timeout=float(sys.argv[2]))
errors = [f"cell {i}: {e[0]}: {e[1][:200]}" for i, c in enumerate(nb.cells)
          if c.cell_type == "code" and (e := cell_error(c))]
print(json.dumps(errors))
"""
TRACE_S = 60.0  # the most one traced job may take
COLLECTIVE_BYTES = 2**22  # 4 MiB per collective in module 00's trace

if __name__ in sys.modules and __name__ != "__main__":  # imported: ranks cannot import it
    cloudpickle.register_pickle_by_value(sys.modules[__name__])


def cuda_seconds(fn: Callable[[], object], repeats: int = 10, warmup: int = 3) -> float:
    """Median seconds of fn() on the current GPU, by CUDA events around each call."""
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(repeats):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) / 1e3)  # ms -> s
    return statistics.median(times)


def measure_matmuls(sizes: tuple[int, ...] = MATMUL_SIZES) -> list[Timing]:
    torch.backends.cuda.matmul.allow_tf32 = False  # fp32 means fp32
    timings = []
    for dtype, name in ((torch.bfloat16, "bf16"), (torch.float32, "fp32")):
        for n in sizes:
            a, b = (torch.randn(n, n, device="cuda", dtype=dtype) for _ in range(2))
            out = torch.empty(n, n, device="cuda", dtype=dtype)
            seconds = cuda_seconds(lambda a=a, b=b, out=out: torch.matmul(a, b, out=out))
            timings.append(Timing(f"matmul {name} {n}^3", matmul_flops(n), seconds, "FLOP/s"))
            del a, b, out
    return timings


def measure_copy(nbytes: int = COPY_BYTES) -> Timing:
    src = torch.empty(nbytes, dtype=torch.uint8, device="cuda")
    dst = torch.empty_like(src)
    seconds = cuda_seconds(lambda: dst.copy_(src))
    return Timing(f"copy {nbytes / 2**30:g} GiB in GPU memory", copy_bytes(nbytes), seconds,
                  "B/s")


def measure_peer_copy(nbytes: int = PEER_BYTES, repeats: int = 10) -> Timing:
    """GPU 0 -> GPU 1, timed on the host around synchronised copies (two devices' clocks)."""
    src = torch.empty(nbytes, dtype=torch.uint8, device="cuda:0")
    dst = torch.empty(nbytes, dtype=torch.uint8, device="cuda:1")
    times = []
    for _ in range(repeats + 2):
        torch.cuda.synchronize(0)
        torch.cuda.synchronize(1)
        start = time.perf_counter()
        dst.copy_(src)
        torch.cuda.synchronize(0)
        torch.cuda.synchronize(1)
        times.append(time.perf_counter() - start)
    return Timing(f"copy {nbytes / 2**20:g} MiB GPU 0 -> GPU 1", copy_bytes(nbytes,
                  same_device=False), statistics.median(times[2:]), "B/s")


def roofline_part(gpus: int) -> list:
    """Rows of part 1: the kernels, the ridge, module 00's thresholds per link."""
    rows, peak = roofline_rows(measure_matmuls(), measure_copy())
    links = {"NVLink 4 per direction (nominal)": costs.NVLINK_PER_DIRECTION_BYTES_PER_S,
             "400G NIC (nominal)": costs.NIC_400G_BYTES_PER_S}
    if gpus >= 2:
        peer = measure_peer_copy()
        rows.append(timing_row(peer))
        links = {"GPU 0 -> GPU 1 (measured)": peer.rate, **links}
    return rows + link_rows(peak, links)


def run_job(cmd: list[str], limit: float, **env: str) -> tuple[object, float, str]:
    """Run `cmd` from the repository root within `limit` seconds, then kill what it left:
    (its CompletedProcess, or None when it ran out of time, seconds, a FAIL line or "")."""
    token = uuid.uuid4().hex
    start = time.perf_counter()
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=limit, cwd=ROOT,
                              env=dict(os.environ, **env, **{KILL_ENV: token}))
    except subprocess.TimeoutExpired:
        return None, time.perf_counter() - start, f"still running after {limit:.0f} s"
    finally:
        kill_kernel_tree(None, f"{KILL_ENV}={token}")
    failed = f"exit {proc.returncode}: {proc.stderr.strip()[-300:]}" if proc.returncode else ""
    return proc, time.perf_counter() - start, failed


def run_notebook(path: Path, limit: float) -> tuple[str, float, str]:
    """Execute one notebook in a child process, in a temporary copy of its folder, with
    NCCL's rules on: (verdict, seconds, detail)."""
    work = Path(tempfile.mkdtemp(prefix="parlab-gpu-check-"))
    shutil.copytree(path.parent, work, dirs_exist_ok=True)
    try:
        proc, seconds, failed = run_job(
            [sys.executable, "-c", RUN_NOTEBOOK, str(work / path.name), str(CELL_S)], limit,
            PARLAB_NCCL_RULES="1")
    finally:
        shutil.rmtree(work, ignore_errors=True)
    if failed or proc is None:
        return "FAIL", seconds, failed
    errors = json.loads(proc.stdout.strip().splitlines()[-1])  # type: ignore[attr-defined]
    return ("FAIL" if errors else "pass"), seconds, "; ".join(errors)


SCRIPTS = {  # part 2's torchrun jobs: (module, ranks, script and its arguments)
    "capstone": ("07_composition", 4, ["scripts/capstone.py", "--dp", "2", "--tp", "2",
                                       "--steps", "10", "--check"]),
    "train.py": ("08_the_whole_machine", 8, [
        "scripts/train.py", "--tensor-model-parallel-size", "2",
        "--pipeline-model-parallel-size", "2", "--sequence-parallel", "--micro-batch-size", "2",
        "--global-batch-size", "8", "--train-iters", "10", "--check"]),
}


def run_script(ranks: int, args: list[str], limit: float) -> tuple[str, float, str]:
    """torchrun a script on `ranks` local processes (NCCL's rules on), within `limit` s."""
    _, seconds, failed = run_job([sys.executable, "-m", "torch.distributed.run", "--standalone",
                                  f"--nproc-per-node={ranks}", *args], limit,
                                 PARLAB_NCCL_RULES="1")
    return ("FAIL" if failed else "pass"), seconds, failed


def notebook_part(gpus: int, deadline: float) -> list:
    """Rows of part 2: one per module notebook, NCCL (and its rules) for runs of at most
    `gpus` ranks; then the capstone and train.py under torchrun where there are GPUs enough."""
    if gpus < 2:
        why = "SKIPPED: one GPU; ranks sharing it over gloo are not built yet"
        return [("notebooks", m, why, "") for m in list_modules(SOLUTIONS_DIR)]
    rows = []
    for module in list_modules(SOLUTIONS_DIR):
        left = deadline - time.monotonic()
        if left < 10:
            rows.append(("notebooks", module, "SKIPPED: out of time budget", ""))
            continue
        verdict, seconds, detail = run_notebook(SOLUTIONS_DIR / module / f"{module}.ipynb",
                                                min(NOTEBOOK_S, left))
        rows.append(("notebooks", module, f"{verdict} {detail}".strip(), f"{seconds:.1f}"))
    for name, (module, ranks, args) in SCRIPTS.items():
        left = deadline - time.monotonic()
        if ranks > gpus or left < 10:
            why = f"{ranks} GPUs needed, {gpus} here" if ranks > gpus else "out of time budget"
            rows.append(("scripts", f"{module} ({name})", f"SKIPPED: {why}", ""))
            continue
        verdict, seconds, detail = run_script(ranks, args, min(NOTEBOOK_S, left))
        rows.append(("scripts", f"{module} ({name})", f"{verdict} {detail}".strip(),
                     f"{seconds:.1f}"))
    return rows


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


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--budget", type=float, default=480.0, help="seconds for the whole check")
    budget = ap.parse_args().budget
    if not torch.cuda.is_available():
        print(NO_GPU)
        return 0
    deadline = time.monotonic() + budget
    gpus = torch.cuda.device_count()
    rows = [("device", f"{gpus} x {torch.cuda.get_device_name(0)}",
             f"torch {torch.__version__}, CUDA {torch.version.cuda}", "")]
    rows += roofline_part(gpus) + notebook_part(gpus, deadline)
    rows += trace_part(gpus, ROOT / "artifacts" / "traces", deadline)
    table = summary_table(rows) + "\n\n" + module_verdicts(rows, list_modules(SOLUTIONS_DIR))
    print(table)
    out = ROOT / "artifacts" / "gpu_check.md"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(table + "\n")
    return 1 if any(row[2].startswith(("FAIL", "SKIPPED")) for row in rows) else 0


if __name__ == "__main__":
    sys.exit(main())
