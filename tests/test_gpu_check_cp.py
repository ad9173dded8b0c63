"""The GPU check's part 4 (scripts/gpu_check_cp.py, PyTorch's context_parallel against the
course's ring) on its CPU path: without two GPUs it says SKIPPED and why; its job, run
anyway on gloo CPU ranks, compares what runs here (not causal: context_parallel all-gathers K
and V) with one device and the ring, and reports the causal case PyTorch refuses on a CPU."""

from __future__ import annotations

import importlib.util
import time

from conftest import ROOT


def _script():
    spec = importlib.util.spec_from_file_location("gpu_check_cp", ROOT / "scripts" /
                                                  "gpu_check_cp.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_without_two_gpus_every_case_is_skipped_with_why():
    check = _script()
    rows = check.cp_rows(0, time.monotonic() + 60, device_ok=False)
    assert len(rows) == len(check.CASES) == 4
    for _, item, result, seconds in rows:
        assert item.startswith("05_context_parallel ("), item  # counted in module 05's verdict
        assert result.startswith("SKIPPED: context_parallel runs a ring only on CUDA"), result
        assert "2 GPUs or more (0 here)" in result and "all-gathers K and V" in result
        assert seconds == ""


def test_the_verdict_fails_a_difference_beyond_the_tolerance():
    check = _script()
    good = {"cp_diff": 1e-6, "ring_diff": 2e-6, "cp_bytes": 10.0, "ring_bytes": 12.0,
            "cp_kinds": ["all_gather_into_tensor"]}
    assert check.verdict(good, causal=False).startswith("pass: ")
    assert check.verdict({**good, "cp_diff": 10 * check.TOLERANCE}, causal=True).startswith(
        "FAIL: ")
    assert check.verdict({**good, "ring_diff": 10 * check.TOLERANCE}, causal=False).startswith(
        "FAIL: ")
    refused = {"refused": "NotImplementedError: no", "ring_diff": 1e-6, "ring_bytes": 1.0}
    assert check.verdict(refused, causal=True).startswith("SKIPPED: context_parallel refused")
    assert check.verdict(refused, causal=False).startswith("FAIL: context_parallel raised")


def test_the_job_on_cpu_ranks_compares_what_runs_and_reports_what_does_not():
    check = _script()
    rows = check.cp_rows(0, time.monotonic() + 120, device_ok=True, world=2, tokens=8,
                         cases=[(False, "allgather"), (True, "allgather")])
    (_, _, plain, _), (_, _, causal, _) = rows
    assert plain.startswith("pass: "), plain
    assert "all_gather_into_tensor, reduce_scatter_tensor" in plain, plain  # no ring on a CPU
    # 2 ranks, B H T D = 2 4 16 64 float32: K and V gathered twice and dK, dV reduce-scattered,
    # (W - 1)/W of the whole K each time: 6 * 1/2 * 2*4*16*64*4 bytes
    assert f"({6 * 2 * 4 * 16 * 64 * 4 // 2:,} B sent by rank 0" in plain, plain
    assert causal.startswith("SKIPPED: context_parallel refused it here (RuntimeError"), causal
    assert "ring " in causal  # the course's ring still ran and was compared
