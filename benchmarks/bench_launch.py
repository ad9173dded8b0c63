"""How long one small distributed job takes to launch: parlab.launch.run against mp.spawn and
torchrun, side by side in one run on this machine.

    make bench        or        .venv/bin/python benchmarks/bench_launch.py [--repeats 5]

The job is the same everywhere: join a gloo group, all-reduce a rank-valued tensor, return.
The launchers take turns (benchmarks/_table.py); we report medians and the ratio to parlab's
warm call. The process's first call starts the forkserver and is reported apart. The target
is a warm 2-rank run() in at most 0.5 s.

Memory, after the timing, in one more untimed launch of each: the peak RSS of a rank process,
the whole of it (benchmarks/_memory.py; largest rank). A parlab rank is forked from the
forkserver, which has imported torch, and its RSS counts the pages it shares with it.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from _memory import mib, peak_rss
from _table import Table, interleave, medians, ratio, repeats_option, setting

from parlab.launch import run

TORCHRUN_SCRIPT = """
import os, torch, torch.distributed as dist
dist.init_process_group("gloo")
x = torch.full((4,), float(dist.get_rank()))
dist.all_reduce(x)
if os.environ.get("PEAK_RSS_DIR"):  # the memory run: this rank's peak RSS (VmHWM), bytes
    hwm = [line for line in open("/proc/self/status") if line.startswith("VmHWM:")][0]
    with open(os.path.join(os.environ["PEAK_RSS_DIR"], str(dist.get_rank())), "w") as f:
        f.write(str(int(hwm.split()[1]) * 1024))
dist.destroy_process_group()
"""
WARM = "parlab.launch.run (warm)"


def job() -> float:
    x = torch.full((4,), float(dist.get_rank()))
    dist.all_reduce(x)
    return x[0].item()


def _spawned(rank: int, world: int, port: int, rss_dir: str | None = None) -> None:
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                            world_size=world)
    job()
    if rss_dir is not None:  # the memory run: this rank's peak RSS
        (Path(rss_dir) / str(rank)).write_text(str(peak_rss()))
    dist.destroy_process_group()


def job_rss() -> int:
    """The job, then this rank's peak RSS (bytes)."""
    job()
    return peak_rss()


def _read_peaks(folder: Path) -> int:
    return max(int(f.read_text()) for f in folder.iterdir())


def rank_memory(world: int, script: Path) -> dict[str, int]:
    """The largest rank's peak RSS under each launcher, one untimed launch each."""
    torchrun = Path(sys.executable).with_name("torchrun")
    peaks = {WARM: max(run(job_rss, world))}
    with tempfile.TemporaryDirectory() as spawn_dir, tempfile.TemporaryDirectory() as tr_dir:
        mp.spawn(_spawned, args=(world, _free_port(), spawn_dir), nprocs=world, join=True)
        peaks["torch.multiprocessing.spawn"] = _read_peaks(Path(spawn_dir))
        subprocess.run([str(torchrun), "--standalone", f"--nproc_per_node={world}",
                        str(script)], check=True, capture_output=True,
                       env=dict(os.environ, OMP_NUM_THREADS="1", PEAK_RSS_DIR=tr_dir))
        peaks["torchrun"] = _read_peaks(Path(tr_dir))
    return peaks


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def launchers(world: int, script: Path) -> dict:
    torchrun = Path(sys.executable).with_name("torchrun")
    return {
        WARM: lambda: run(job, world),
        "torch.multiprocessing.spawn": lambda: mp.spawn(
            _spawned, args=(world, _free_port()), nprocs=world, join=True),
        "torchrun": lambda: subprocess.run(
            [str(torchrun), "--standalone", f"--nproc_per_node={world}", str(script)],
            check=True, capture_output=True, env=dict(os.environ, OMP_NUM_THREADS="1")),
    }


def main() -> None:
    repeats = repeats_option(__doc__, default=5)
    script = Path(tempfile.mkdtemp()) / "job.py"
    script.write_text(TORCHRUN_SCRIPT)
    table = Table(setting("launching a 1-all-reduce job; peak RSS MiB of a rank process "
                          "(whole process, largest rank, one more untimed launch)", repeats),
                  ["ranks", "launcher", "median s", "x parlab warm", "rank peak RSS MiB"])
    start = time.perf_counter()
    run(job, 2)
    cold = time.perf_counter() - start
    for world in (2, 4):
        times = medians(interleave(launchers(world, script), repeats))
        memory = rank_memory(world, script)
        if world == 2:
            table.add(world, "parlab.launch.run (first call: starts the forkserver)",
                      f"{cold:.3f}", ratio(cold, times[WARM]), "")
        for name, median in times.items():
            table.add(world, name, f"{median:.3f}", ratio(median, times[WARM]),
                      mib(memory[name]))
    table.emit("launch")


if __name__ == "__main__":
    main()
