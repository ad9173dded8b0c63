"""Host clocks that time NCCL work stop when the GPU is done, not when the work was queued.

Under NCCL a collective's `wait()` returns as soon as the wait is queued on the GPU's stream,
so a clock read right after it measures about nothing. `parlab.launch.synchronize()` blocks
until the rank's device is done; here the device's finish is faked as a 0.2 s synchronize and
the timings of DDP (`wait_s`) and of the ring's measured transfers must include it. Without
the synchronize they read about 0 (the tests fail).
"""

from __future__ import annotations

import time

import torch
from torch import nn

import parlab.cp.measure as cp_measure
import parlab.dp.ddp as ddp_module
from parlab.launch import devices

GPU_FINISH_S = 0.2  # how long the faked GPU takes to finish its queued work


def _slow_gpu() -> None:
    time.sleep(GPU_FINISH_S)


def test_synchronize_waits_for_the_gpu_and_skips_the_cpu(monkeypatch) -> None:
    calls: list[object] = []
    monkeypatch.setattr(torch.cuda, "synchronize", lambda d=None: calls.append(d))
    monkeypatch.setattr(devices, "device", lambda: torch.device("cpu"))
    devices.synchronize()
    assert calls == [], "synchronize() on the CPU must not touch CUDA"
    monkeypatch.setattr(devices, "device", lambda: torch.device("cuda", 3))
    devices.synchronize()
    assert calls == [torch.device("cuda", 3)], f"synchronize() on GPU 3 called {calls}"


def test_ddp_wait_includes_the_gpus_finish(monkeypatch) -> None:
    monkeypatch.setattr(ddp_module, "synchronize", _slow_gpu)
    model = nn.Sequential(nn.Linear(4, 4), nn.Linear(4, 4))
    ddp = ddp_module.BucketedDDP(model.parameters(), bucket_bytes=4 * 4 * 4)
    for p in model.parameters():
        p.grad = torch.ones_like(p)
    stats = ddp.finish()
    assert stats.wait_s >= GPU_FINISH_S, (
        f"wait_s = {stats.wait_s:.3f} s: the clock stopped before the device was done")


class _QueuedTransfer:
    """A ring step whose wait() returns at once, as NCCL's does once the wait is queued."""

    def wait(self) -> list[torch.Tensor]:
        return []


def test_ring_transfer_ends_when_the_gpu_is_done(monkeypatch) -> None:
    monkeypatch.setattr(cp_measure, "synchronize", _slow_gpu)
    events: list[tuple[str, float, float]] = []
    timed = cp_measure._TimedTransfer(_QueuedTransfer(), 0.0, events, time.perf_counter())
    timed.wait()
    (start, end), = [(s, e) for kind, s, e in events if kind == "wait"]
    assert end - start >= GPU_FINISH_S, (
        f"the wait lasted {end - start:.3f} s: it ended before the device was done")
