"""parlab.dp.ddp (bucketed, overlapped gradient all-reduce) and parlab.dp.zero1 (sharded Adam).

References computed here, independently of the library: the gradients and AdamW steps of the
same seeded model on the whole batch, on one process (each rank rebuilds it); the tracer's
view (`parlab.comm`) of which collectives ran and when their first call started, seen by a
listener of its own, not by the DDP object's statistics; bytes from the ring formulas written
out here.
"""

from __future__ import annotations

import time

import pytest
import torch
from torch import nn

from parlab.dp.ddp import make_buckets
from parlab.launch import run

WIDTH, LAYERS, BATCH = 24, 6, 12  # 12 rows split over 2 or 3 ranks


def _model() -> nn.Sequential:
    torch.manual_seed(0)
    return nn.Sequential(*[m for _ in range(LAYERS) for m in (nn.Linear(WIDTH, WIDTH),
                                                                nn.Tanh())])


def _data() -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(1)
    return torch.randn(BATCH, WIDTH, generator=g), torch.randn(BATCH, WIDTH, generator=g)


def _my_rows(t: torch.Tensor) -> torch.Tensor:
    import torch.distributed as dist

    d, r = dist.get_world_size(), dist.get_rank()
    n = t.shape[0] // d
    return t[r * n:(r + 1) * n]


def test_buckets_follow_backward_order_and_size():
    model = _model()
    buckets = make_buckets(model.parameters(), bucket_bytes=WIDTH * WIDTH * 4 + 1)
    order = [p for b in buckets for p in b.params]
    assert order == list(reversed(list(model.parameters())))  # last layer first
    assert all(b.nbytes >= WIDTH * WIDTH * 4 + 1 for b in buckets[:-1])
    assert len(buckets) == LAYERS  # a weight and its bias make one bucket each
    with pytest.raises(ValueError, match="positive int"):
        make_buckets(model.parameters(), bucket_bytes=0)


def _ddp_worker(micro: int) -> dict:
    import torch.distributed as dist

    from parlab import comm
    from parlab.dp.ddp import BucketedDDP

    model, (x, y) = _model(), _data()
    ddp = BucketedDDP(model.parameters(), bucket_bytes=2 * WIDTH * WIDTH * 4)
    calls: list[tuple[str, float]] = []
    listener = lambda phase, e: calls.append((e.kind, time.perf_counter())) if (  # noqa: E731
        phase == "start") else None
    comm.add_listener(listener)
    xs, ys = _my_rows(x).chunk(micro), _my_rows(y).chunk(micro)
    for i in range(micro - 1):
        with ddp.no_sync():
            (nn.functional.mse_loss(model(xs[i]), ys[i]) / micro).backward()
    during_no_sync = len(calls)
    (nn.functional.mse_loss(model(xs[-1]), ys[-1]) / micro).backward()
    backward_done = time.perf_counter()
    stats = ddp.finish()
    comm.remove_listener(listener)
    reference = _model()
    nn.functional.mse_loss(reference(x), y).backward()  # the whole batch, one process
    return {"during_no_sync": during_no_sync, "kinds": {k for k, _ in calls if "wait(" not in k},
            "waits": {k for k, _ in calls if "wait(" in k},
            "first_call": min(t for _, t in calls), "backward_done": backward_done,
            "stats_first": stats.first_start, "buckets": len(ddp.buckets),
            "diff": max((p.grad - q.grad).abs().max().item()
                        for p, q in zip(model.parameters(), reference.parameters(),
                                        strict=True)),
            "world": dist.get_world_size()}


@pytest.mark.parametrize("world, micro", [(2, 1), (3, 2)])
def test_averaged_gradients_equal_the_whole_batch(world, micro):
    for r in run(_ddp_worker, world, micro):
        assert r["diff"] < 1e-6, r
        assert r["kinds"] == {"all_reduce"}
        assert r["waits"] == {"wait(all_reduce)"}  # finish() waits on the async all-reduces
        assert r["during_no_sync"] == 0  # accumulation micro-batches did not communicate


def test_first_bucket_leaves_before_backward_ends():
    for r in run(_ddp_worker, 2, 1):
        assert r["buckets"] > 1
        assert r["first_call"] < r["backward_done"], r  # seen by the tracer, not by DDP
        assert r["stats_first"] is not None and r["stats_first"] <= r["backward_done"]


def _zero_worker(steps: int) -> dict:
    import torch.distributed as dist

    from parlab import comm
    from parlab.dp.zero1 import ZeRO1

    # float64: Adam divides by sqrt(v), which turns rounding in near-zero gradients into
    # visible steps; in float64 that rounding is ~1e-16 and the comparison can be tight
    model, reference = _model().double(), _model().double()
    x, y = (t.double() for t in _data())
    opt = ZeRO1(model.parameters(), lr=1e-2)
    ref_opt = torch.optim.AdamW(reference.parameters(), lr=1e-2)
    with comm.trace() as tr:
        for _ in range(steps):
            nn.functional.mse_loss(model(_my_rows(x)), _my_rows(y)).backward()
            opt.step()
            opt.zero_grad()
    for _ in range(steps):
        nn.functional.mse_loss(reference(x), y).backward()
        ref_opt.step()
        ref_opt.zero_grad()
    full_state = sum(v.numel() * v.element_size() for s in ref_opt.state.values()
                     for v in s.values() if v.dim() > 0)
    return {"diff": max((p - q).abs().max().item() for p, q in
                        zip(model.parameters(), reference.parameters(), strict=True)),
            "kinds": sorted({e.kind for e in tr.events}), "wire": tr.wire_bytes(),
            "state": opt.state_bytes(), "full_state": full_state, "d": dist.get_world_size(),
            "padded": opt.padded}


@pytest.mark.parametrize("world", [2, 3])
def test_zero1_trains_like_adamw_with_a_share_of_its_state(world):
    steps = 3
    n = sum(p.numel() for p in _model().parameters())
    for r in run(_zero_worker, world, steps):
        assert r["diff"] < 1e-12, r
        assert r["kinds"] == ["all_gather_single", "reduce_scatter_single"]
        d, padded = r["d"], r["padded"]
        assert padded == -(-n // d) * d
        # per step: reduce-scatter (d-1)/d of the gradients, all-gather (d-1)/d of the weights
        assert r["wire"] == pytest.approx(steps * 2 * (d - 1) / d * padded * 8)
        # two moments + the master slice: 3/2 of Adam's state, over d
        assert r["state"] == pytest.approx(r["full_state"] * 1.5 * (padded / d) / n)
