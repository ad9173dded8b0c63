"""BucketedDDP's order and misuse rules, and its place in the composed runs (module 08).

References computed here, independently of the library: which buckets a hand-made order of
gradient hooks must have started (buckets leave in order, bucket 0 first); and, in a traced
DP 2 × PP 2 run, the ranges the profiler saw: a bucket's all-reduce started inside the last
backward of the pipeline, not after it, read from the merged trace rather than from the DDP's
own statistics.
"""

from __future__ import annotations

import pytest
import torch
from torch import nn

from parlab.dp.ddp import BucketedDDP
from parlab.launch import run
from parlab.timeline import load


def _model() -> nn.Sequential:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(8, 8), nn.Linear(8, 8), nn.Linear(8, 8))


def test_buckets_leave_in_order_whatever_order_gradients_arrive_in():
    model = _model()
    ddp = BucketedDDP(model.parameters(), bucket_bytes=8 * 8 * 4)  # one Linear per bucket
    assert len(ddp.buckets) == 3
    for p in model.parameters():
        p.grad = torch.ones_like(p)
    for p in ddp.buckets[1].params:  # bucket 1 complete first: it must wait for bucket 0
        ddp._ready(p)
    assert ddp.stats.starts == []
    for p in ddp.buckets[0].params:  # now 0 leaves, and 1 right after it
        ddp._ready(p)
    assert [b.started is not None for b in ddp.buckets] == [True, True, False]
    assert ddp.buckets[0].started <= ddp.buckets[1].started
    stats = ddp.finish()  # bucket 2 leaves in finish
    assert stats.in_hooks == 2 and len(stats.starts) == 3


def test_a_second_synced_backward_is_refused_and_no_sync_accumulates():
    model, x = _model(), torch.randn(4, 8)
    ddp = BucketedDDP(model.parameters(), bucket_bytes=8 * 8 * 4)
    with ddp.no_sync():
        model(x).sum().backward()
    assert ddp.stats.starts == []  # nothing left during accumulation
    model(x).sum().backward()
    with pytest.raises(RuntimeError, match="no_sync"):
        model(x).sum().backward()  # the buckets already left without this gradient
    ddp.discard()  # drops the round: the next synced backward starts afresh
    model(x).sum().backward()
    assert ddp.finish().in_hooks == 3


def _traced_step() -> list[int]:
    from parlab.compose import Plan, data_parallel, setup, train_step
    from parlab.model import LlamaConfig, load_corpus

    rep = setup(LlamaConfig(), Plan(dp=2, pp=2, micro_batch_size=2), lr=3e-3)
    train_step(rep, 0, load_corpus()[0])
    return [len(d.buckets) for d in data_parallel(rep.model, rep.grid)]


@pytest.mark.slow
@pytest.mark.usefixtures("no_orphans")
def test_composed_dp_buckets_leave_during_the_last_backward(tmp_path):
    buckets = run(_traced_step, 4, trace=tmp_path / "run.json", timeout=120)
    tl = load(tmp_path / "run.json")
    for rank in range(4):
        backwards = tl.ranges(rank=rank, prefix="B ")
        starts = tl.ranges(rank=rank, prefix="allreduce bucket ")
        assert len(starts) == buckets[rank][0] > 1, (rank, starts)
        last = backwards[-1]
        # the first bucket left inside the last backward: overlap, seen by the profiler
        assert last.start <= starts[0].start < last.end, (rank, last, starts[0])
        earlier = [r for r in backwards[:-1] if r.end <= last.start]
        assert all(s.start > r.end for s in starts for r in earlier)  # no_sync before it
        assert len(tl.ranges(rank=rank, prefix="wait bucket ")) == len(starts)
