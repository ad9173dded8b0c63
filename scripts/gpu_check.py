"""The GPU check: a roofline of this card, then every module's solution notebook on NCCL.

    scripts/gpu_check.sh        or        .venv/bin/python scripts/gpu_check.py [--budget 480]

1. One GPU, a roofline lab: median time of square matmuls (bf16 and fp32, TF32 off, a few
   sizes) and of a large copy within the card's memory, turned into FLOP/s, bytes/s and the
   ridge, the FLOP-per-byte threshold of module 00 (`parlab.costs.roofline`, `parlab.costs`); with
   two GPUs also a copy from GPU 0 to GPU 1, the link between them. Module 00's verdicts for
   tensor and data parallelism follow, for each link, at the measured peak.
2. Each module's solution notebook (solutions/*/*.ipynb, hidden tests
   included) runs in a fresh kernel as the autograder runs it (`parlab.grading.
   execute_notebook`, in a temporary copy of its folder) with NCCL's rules on
   (PARLAB_NCCL_RULES=1); `parlab.launch.run` then picks NCCL for every run of at most as many
   ranks as GPUs. Then the capstone (scripts/capstone.py, DP 2 × TP 2) and module 08's
   scripts/train.py (TP 2 × PP 2 × DP, SP) under torchrun, both with --check against one
   device. Pass means no cell raised (a script: exit 0). Each gets at most NOTEBOOK_S seconds
   and the whole check `--budget` seconds: one still running is killed with everything it
   started, and what the budget cannot reach is SKIPPED (which counts as not passed). With one
   GPU the notebooks run with every rank on it over gloo (PARLAB_ONE_GPU=0: gloo takes CUDA
   tensors for all_reduce and broadcast, the rest go through the host, parlab.comm.staging),
   so the device placement is exercised; the scripts are SKIPPED (they need 4 and 8 GPUs).
3. One profiler trace per module (`trace_part`, scripts/gpu_check_traces.py): a small job
   of that module's parallelism (module 00's collectives; one training step of
   `parlab.compose` laid out as that module splits the model: DP, TP, TP+SP, PP, CP, EP, then
   DP × PP × TP) run through `parlab.launch.run(..., trace=)` on two ranks, NCCL, so that
   the trace holds the GPUs' kernels and copies beside the CPU ranges
   (`parlab.timeline.profiled(cuda=True)`). Each lands in artifacts/traces/<module>.json, for
   Perfetto; its row counts the ranks' rows, the ranges and the CUDA kernels. With one GPU
   only a one-rank step is traced.
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
from collections.abc import Callable
from pathlib import Path

import torch

from parlab import costs
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

sys.path.insert(0, str(Path(__file__).resolve().parent))  # part 3, beside this file
from gpu_check_traces import trace_jobs, trace_part  # noqa: E402, F401 - trace_jobs: tests


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


def notebook_env(gpus: int) -> dict[str, str]:
    """How part 2 runs a notebook: NCCL's rules on; with one GPU, every rank on it over gloo
    (PARLAB_ONE_GPU: what gloo cannot take on CUDA goes through the host)."""
    return {"PARLAB_NCCL_RULES": "1", **({"PARLAB_ONE_GPU": "0"} if gpus == 1 else {})}


def run_notebook(path: Path, limit: float, env: dict[str, str]) -> tuple[str, float, str]:
    """Execute one notebook in a child process, in a temporary copy of its folder, with
    `env` added: (verdict, seconds, detail)."""
    work = Path(tempfile.mkdtemp(prefix="parlab-gpu-check-"))
    shutil.copytree(path.parent, work, dirs_exist_ok=True)
    try:
        proc, seconds, failed = run_job(
            [sys.executable, "-c", RUN_NOTEBOOK, str(work / path.name), str(CELL_S)], limit,
            **env)
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
    """Rows of part 2: one per module notebook (`notebook_env`: NCCL for runs of at most
    `gpus` ranks, or all ranks on the one GPU over gloo); then the capstone and train.py
    under torchrun where there are GPUs enough."""
    rows = []
    for module in list_modules(SOLUTIONS_DIR):
        left = deadline - time.monotonic()
        if left < 10:
            rows.append(("notebooks", module, "SKIPPED: out of time budget", ""))
            continue
        verdict, seconds, detail = run_notebook(SOLUTIONS_DIR / module / f"{module}.ipynb",
                                                min(NOTEBOOK_S, left), notebook_env(gpus))
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
