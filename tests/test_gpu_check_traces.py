"""The GPU check's traces (scripts/gpu_check.py, part 3), on the CPU path: the same jobs run
on gloo when there is no GPU, so their traces can be checked here. On a GPU box they run on
NCCL and the trace holds the CUDA kernels too (`parlab.timeline.profiled(cuda=True)`)."""

from __future__ import annotations

import importlib.util
import time

from conftest import ROOT

from parlab.grading import SOLUTIONS_DIR, list_modules
from parlab.timeline import load


def _script():
    spec = importlib.util.spec_from_file_location("gpu_check_traces", ROOT / "scripts" /
                                                  "gpu_check.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_every_module_has_a_traced_job():
    jobs = _script().trace_jobs(2)
    assert set(list_modules(SOLUTIONS_DIR)) <= set(jobs), set(list_modules(SOLUTIONS_DIR)) - set(
        jobs)
    assert list(_script().trace_jobs(1)) == ["one GPU"]


def test_module_00_s_trace_has_a_row_per_rank_and_each_collective(tmp_path):
    check = _script()
    rows = check.trace_part(0, tmp_path, time.monotonic() + 120, world=2,
                            modules={"00_collectives"})
    assert len(rows) == 1 and rows[0][2].startswith("pass: 2 rank rows"), rows
    tl = load(tmp_path / "00_collectives.json")
    assert tl.ranks == [0, 1]
    for rank in (0, 1):
        for name in ("all_reduce", "all_gather", "reduce_scatter", "broadcast"):
            mine = tl.ranges(rank=rank, prefix=f"{name} 4 MiB")
            assert len(mine) == 1, (rank, name)
            inside = tl.ranges(rank=rank, prefix="comm ", within=(mine[0].start, mine[0].end))
            assert inside, f"rank {rank}: no traced call inside {mine[0]}"
