"""The GPU check (scripts/gpu_check.sh): its arithmetic against hand-computed values, its
answer on a machine without CUDA, and, on a GPU box only (marker `gpu`), its measurements."""

from __future__ import annotations

import importlib.util
import subprocess
from types import ModuleType

import pytest
import torch
from conftest import ROOT

from parlab.costs.roofline import (
    Timing,
    copy_bytes,
    format_rate,
    link_rows,
    matmul_flops,
    module_verdicts,
    roofline_rows,
    summary_table,
)

SCRIPT = ROOT / "scripts" / "gpu_check.py"


def load_script() -> ModuleType:
    spec = importlib.util.spec_from_file_location("gpu_check", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_work_per_kernel():
    assert matmul_flops(4096) == 2 * 4096**3
    assert matmul_flops(2, 3, 4) == 48  # (2x3)@(3x4): 8 output entries, 3 multiply-adds each
    assert copy_bytes(1e9) == 2e9  # read and write
    assert copy_bytes(1e9, same_device=False) == 1e9  # over the link once


def test_rates_from_times():
    assert Timing("mm", 2e12, 0.004, "FLOP/s").rate == pytest.approx(5e14)
    with pytest.raises(ValueError, match="> 0 s"):
        _ = Timing("mm", 1.0, 0.0, "FLOP/s").rate


@pytest.mark.parametrize(("rate", "unit", "text"), [
    (989e12, "FLOP/s", "989 TFLOP/s"), (4.21e12, "B/s", "4.21 TB/s"),
    (12.5e9, "B/s", "12.5 GB/s"), (1.2e15, "FLOP/s", "1.2 PFLOP/s"), (500, "B/s", "500 B/s")])
def test_format_rate(rate, unit, text):
    assert format_rate(rate, unit) == text


def test_ridge_is_peak_flops_over_memory_bandwidth():
    # bf16: 2e9 FLOPs in 2 us = 1e15 FLOP/s; fp32 ten times slower; copy: 2e9 B in 0.5 ms.
    matmuls = [Timing("bf16", matmul_flops(1000), 2e-6, "FLOP/s"),
               Timing("fp32", matmul_flops(1000), 2e-5, "FLOP/s")]
    rows, peak = roofline_rows(matmuls, Timing("copy", copy_bytes(1e9), 5e-4, "B/s"))
    assert peak == pytest.approx(1e15)
    assert [r[2] for r in rows] == ["1 PFLOP/s", "100 TFLOP/s", "4 TB/s", "250 FLOP/B"]


def test_link_thresholds_and_module_00_verdicts():
    nvlink, nic = link_rows(1e15, {"NVLink": 450e9, "NIC": 50e9})
    # 1e15 / 450e9 = 2,222 FLOP/B; TP offers H = 8192: 3.7x headroom; DP 1.2e7: 5,400x.
    assert nvlink[2].startswith("2,222 FLOP/B needed")
    assert "compute-bound with 3.7x headroom" in nvlink[2]
    assert "compute-bound with 5,400x headroom" in nvlink[2]
    # 1e15 / 50e9 = 20,000 FLOP/B; TP: 8192 / 20000 = 0.41, short by 2.4x.
    assert nic[2].startswith("20,000 FLOP/B needed")
    assert "comm-bound: short by 2.4x" in nic[2]
    assert nic[1] == "NIC, 50 GB/s"


def test_summary_table_is_markdown():
    text = summary_table([("notebooks", "00_collectives", "pass", "12.3")])
    assert text.splitlines() == ["| part | item | result | s |", "|---|---|---|---|",
                                 "| notebooks | 00_collectives | pass | 12.3 |"]


def test_one_verdict_per_module_skipped_is_not_passed():
    rows = [("notebooks", "00_collectives", "pass", "12.3"),
            ("traces", "00_collectives", "FAIL: RuntimeError: NCCL error", "1.0"),
            ("notebooks", "01_memory_and_sharding", "pass", "5.0"),
            ("notebooks", "07_composition", "pass", "50.0"),
            ("scripts", "07_composition (capstone)", "SKIPPED: 4 GPUs needed, 2 here", ""),
            ("traces", "one GPU", "pass", "2.0")]
    modules = ["00_collectives", "01_memory_and_sharding", "07_composition", "09_checkpoints"]
    lines = module_verdicts(rows, modules).splitlines()
    assert lines[2:] == [
        "| 00_collectives | FAILED: RuntimeError: NCCL error |",
        "| 01_memory_and_sharding | passed |",
        "| 07_composition | SKIPPED: 4 GPUs needed, 2 here |",
        "| 09_checkpoints | SKIPPED: not reached |"], lines


def test_part_two_runs_notebooks_with_ncclss_rules_and_on_one_gpu_over_gloo():
    """What the check runs, read from its plan (no GPU needed): every notebook with NCCL's
    rules, on one GPU with every rank on it (PARLAB_ONE_GPU); the capstone on 4 ranks and
    train.py on 8, each with --check against one device."""
    check = load_script()
    assert check.notebook_env(1) == {"PARLAB_NCCL_RULES": "1", "PARLAB_ONE_GPU": "0"}
    assert check.notebook_env(8) == {"PARLAB_NCCL_RULES": "1"}
    assert {name: (ranks, "--check" in args) for name, (_, ranks, args) in
            check.SCRIPTS.items()} == {"capstone": (4, True), "train.py": (8, True)}


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has CUDA: the real check")
def test_without_cuda_it_says_what_it_needs_and_exits_0():
    proc = subprocess.run([str(ROOT / "scripts" / "gpu_check.sh")], capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert "needs CUDA" in proc.stdout and "scripts/gpu_check.sh" in proc.stdout


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_measured_rates_are_plausible():
    check = load_script()
    bf16, fp32 = check.measure_matmuls((2048,))
    copy = check.measure_copy(2**26)
    assert 1e12 < fp32.rate < bf16.rate < 1e16, (fp32, bf16)  # a GPU, not a CPU nor a typo
    assert 1e10 < copy.rate < 1e14, copy


@pytest.mark.gpu
@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs two GPUs")
def test_peer_copy_is_measured():
    peer = load_script().measure_peer_copy(2**24, repeats=3)
    assert 1e9 < peer.rate < 1e13, peer
