"""How long one small distributed job takes to launch: parlab.launch.run against mp.spawn and
torchrun, side by side in one run on this machine.

    .venv/bin/python benchmarks/bench_launch.py [--repeats 5]

The job is the same everywhere: join a gloo group, all-reduce a rank-valued tensor, return.
We report medians and the ratio to parlab's warm call (the first call starts the forkserver
and is reported apart). The target is a warm 2-rank run() in at most 0.5 s.
"""

from __future__ import annotations

import argparse
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from parlab.launch import run


def job() -> float:
    x = torch.full((4,), float(dist.get_rank()))
    dist.all_reduce(x)
    return x[0].item()


def _spawned(rank: int, world: int, port: int) -> None:
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                            world_size=world)
    job()
    dist.destroy_process_group()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


TORCHRUN_SCRIPT = """
import torch, torch.distributed as dist
dist.init_process_group("gloo")
x = torch.full((4,), float(dist.get_rank()))
dist.all_reduce(x)
dist.destroy_process_group()
"""


def time_it(fn, repeats: int) -> list[float]:
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return times


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=5)
    repeats = ap.parse_args().repeats
    script = Path(tempfile.mkdtemp()) / "job.py"
    script.write_text(TORCHRUN_SCRIPT)
    torchrun = Path(sys.executable).with_name("torchrun")
    rows = []
    for world in (2, 4):
        cold = time_it(lambda w=world: run(job, w), 1)[0]
        launchers = {
            "parlab.launch.run (warm)": lambda w=world: run(job, w),
            "torch.multiprocessing.spawn": lambda w=world: mp.spawn(
                _spawned, args=(w, _free_port()), nprocs=w, join=True),
            "torchrun": lambda w=world: subprocess.run(
                [str(torchrun), "--standalone", f"--nproc_per_node={w}", str(script)],
                check=True, capture_output=True, env=dict(os.environ, OMP_NUM_THREADS="1")),
        }
        medians = {name: statistics.median(time_it(fn, repeats)) for name, fn in
                   launchers.items()}
        base = medians["parlab.launch.run (warm)"]
        rows.append((world, "parlab.launch.run (first call)", cold, cold / base))
        rows += [(world, name, m, m / base) for name, m in medians.items()]
    print(f"launching a 1-all-reduce job, median of {repeats}, {os.cpu_count()} cores, "
          f"torch {torch.__version__}")
    print("| ranks | launcher | median s | x parlab warm |\n|---|---|---|---|")
    for world, name, m, ratio in rows:
        print(f"| {world} | {name} | {m:.3f} | {ratio:.1f} |")


if __name__ == "__main__":
    main()
