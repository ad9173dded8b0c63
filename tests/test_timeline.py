"""parlab.timeline and run(..., trace=): one merged Chrome trace per run, one row per rank.

References computed here, independently of the merge: the ranges each rank opens (named and
counted by the test's own function), and an all-reduce, which no rank can leave before every
rank has entered it, so its end marks the same moment on every rank if the clocks are aligned.
The bubble arithmetic is checked on a trace written out by hand.
"""

from __future__ import annotations

import json

import pytest

from parlab.launch import run
from parlab.timeline import CLOCK_SYNC, Timeline, idle_share, load, merge

STEPS = 4


def _work() -> int:
    import torch
    import torch.distributed as dist
    from torch.profiler import record_function

    rank = dist.get_rank()
    for i in range(STEPS):
        with record_function(f"F mb{i}"):
            x = torch.randn(64 * (rank + 1), 64) @ torch.randn(64, 64)  # unequal work per rank
        dist.all_reduce(torch.ones(8))
        del x
    return rank


@pytest.fixture(scope="module")
def traced(tmp_path_factory):
    path = tmp_path_factory.mktemp("trace") / "run.json"
    assert run(_work, 3, trace=path) == [0, 1, 2]
    return path


def test_the_merged_trace_has_one_row_per_rank_and_every_range_once(traced):
    data = json.loads(traced.read_text())  # valid JSON, what Perfetto and chrome://tracing read
    names = {e["pid"]: e["args"]["name"] for e in data["traceEvents"]
             if e.get("ph") == "M" and e["name"] == "process_name"}
    assert names == {0: "rank 0", 1: "rank 1", 2: "rank 2"}
    tl = load(traced)
    start, end = tl.span("F ")
    for rank in range(3):
        got = [r.name for r in tl.ranges(rank=rank, prefix="F ")]
        assert got == [f"F mb{i}" for i in range(STEPS)]  # each once, in order
        assert all(start <= r.start <= r.end <= end for r in tl.ranges(rank=rank, prefix="F "))
        assert len(tl.ranges(rank=rank, prefix="comm all_reduce")) == STEPS  # the tracer's


def test_the_ranks_clocks_are_aligned(traced):
    tl = load(traced)
    ends = [[r.end for r in tl.ranges(rank=k, prefix="comm all_reduce")] for k in range(3)]
    for step in range(STEPS):
        moments = [ends[k][step] for k in range(3)]
        assert max(moments) - min(moments) < 0.05, moments  # one all-reduce, one moment


def _event(pid: int, name: str, start_us: float, dur_us: float) -> dict:
    return {"ph": "X", "pid": pid, "tid": 0, "name": name, "ts": start_us, "dur": dur_us}


def test_idle_share_is_the_bubble_of_a_known_timeline():
    # two ranks over 0..4 s: rank 0 works 0-1 and 2-4 (3 s), rank 1 works 1-2 (1 s), so the
    # ranks are busy 4 s of 2 x 4 s: the idle share is 1/2
    events = [_event(0, "F mb0", 0, 1e6), _event(0, "B mb0", 2e6, 2e6),
              _event(1, "F mb0", 1e6, 1e6), _event(0, "comm send", 0.5e6, 0.1e6)]
    events += [{"ph": "M", "name": "process_name", "pid": p, "args": {"name": f"rank {p}"}}
               for p in (0, 1)]
    tl = Timeline({"traceEvents": events})
    assert idle_share(tl, ("F ", "B ")) == pytest.approx(0.5)
    assert idle_share(tl, ("F ", "B "), ranks=[0]) == pytest.approx(0.25)


def test_merge_refuses_a_trace_without_the_clock_mark(tmp_path):
    part = tmp_path / "rank0.json"
    part.write_text(json.dumps({"traceEvents": [_event(0, "F mb0", 0, 1)]}))
    with pytest.raises(ValueError, match=CLOCK_SYNC):
        merge([part], tmp_path / "out.json")
