"""Ranks sharing one GPU over gloo (PARLAB_ONE_GPU): calls gloo cannot make on CUDA tensors go
through the host (parlab.comm.staging), and the learner's own tensors get the results.

This machine has no GPU, so the ranks stage their CPU tensors instead (`enable(("cpu",))`):
the same copies out and back. Each result is checked against its closed form, computed here
from the ranks' known inputs; without the copy back the outputs stay as allocated (NaN) and
the receive buffers empty, so the tests fail. all_reduce, which gloo runs on CUDA tensors
itself, is not staged.
"""

from __future__ import annotations

import sys

import cloudpickle
import pytest
import torch
import torch.distributed as dist

from parlab.comm import staging as comm_staging
from parlab.launch import devices, run

cloudpickle.register_pickle_by_value(sys.modules[__name__])  # ranks need not import this file
W = 2


def _calls() -> dict:
    comm_staging.enable(("cpu",))
    r = dist.get_rank()
    mine = torch.arange(4, dtype=torch.float64) + 10 * r  # (4,): r*10 .. r*10+3
    out: dict = {}
    gathered = torch.full((W * 4,), float("nan"), dtype=torch.float64)
    dist.all_gather_into_tensor(gathered, mine)
    out["all_gather"] = gathered
    part = torch.full((4,), float("nan"), dtype=torch.float64)  # (8,) over W = 2 ranks
    dist.reduce_scatter_tensor(part, torch.cat([mine, mine]))
    out["reduce_scatter"] = part
    swapped = torch.full((4,), float("nan"), dtype=torch.float64)
    dist.all_to_all_single(swapped, mine)
    out["all_to_all"] = swapped
    got = torch.full((4,), float("nan"), dtype=torch.float64)
    send = (dist.isend, mine, 1 - r)
    recv = (dist.irecv, got, 1 - r)
    for work in [post(t, peer) for post, t, peer in ((send, recv) if r == 0 else (recv, send))]:
        work.wait()
    out["irecv"] = got
    before = comm_staging.copies[0]
    total = mine.clone()
    dist.all_reduce(total)
    out["all_reduce"], out["all_reduce_staged"] = total, comm_staging.copies[0] - before
    out["mine_after"] = mine
    return out


@pytest.fixture(scope="module")
def results() -> list[dict]:
    return run(_calls, W)


def _mine(r: int) -> torch.Tensor:
    return torch.arange(4, dtype=torch.float64) + 10 * r


def test_collectives_through_the_host_fill_the_learners_tensors(results) -> None:
    ranks = [_mine(r) for r in range(W)]
    for r, got in enumerate(results):
        assert torch.equal(got["all_gather"], torch.cat(ranks)), (r, got["all_gather"])
        # reduce_scatter of [mine, mine] (8 values): rank r gets the sum of chunk r
        chunks = [torch.cat([m, m]).view(W, 4 * 2 // W) for m in ranks]
        assert torch.equal(got["reduce_scatter"], sum(c[r] for c in chunks)), r
        assert torch.equal(got["all_to_all"], torch.cat([m.view(W, 2)[r] for m in ranks])), r
        assert torch.equal(got["irecv"], ranks[1 - r]), f"rank {r} received {got['irecv']}"
        assert torch.equal(got["mine_after"], ranks[r]), "an input changed"


def test_what_gloo_takes_on_the_gpu_is_not_staged(results) -> None:
    for got in results:
        assert torch.equal(got["all_reduce"], sum(_mine(r) for r in range(W)))
        assert got["all_reduce_staged"] == 0, "all_reduce went through the host"


def test_one_gpu_is_read_and_checked(monkeypatch) -> None:
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    monkeypatch.delenv("PARLAB_ONE_GPU", raising=False)
    assert devices.one_gpu() is None
    monkeypatch.setenv("PARLAB_ONE_GPU", "1")
    assert devices.one_gpu() == 1
    for bad in ("2", "gpu0", "-1"):
        monkeypatch.setenv("PARLAB_ONE_GPU", bad)
        with pytest.raises(ValueError, match="PARLAB_ONE_GPU=0"):
            devices.one_gpu()


def test_a_placed_rank_computes_on_its_gpu_over_gloo(monkeypatch) -> None:
    """device() is the GPU the launcher placed the rank on, whatever the backend."""
    monkeypatch.setattr(devices, "_placed", [None])
    assert devices.device() == torch.device("cpu")
    devices.place(0)
    assert devices.device() == torch.device("cuda", 0)
