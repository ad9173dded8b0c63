"""parlab.timeline and run(..., trace=): one merged Chrome trace per run, one row per rank.

References computed here, independently of the merge: the ranges each rank opens (named and
counted by the test's own function), and an all-reduce, which no rank can leave before every
rank has entered it, so its end marks the same moment on every rank if the clocks are aligned.
The bubble arithmetic is checked on a trace written out by hand.
"""

from __future__ import annotations

import json
import re

import pytest

from parlab.launch import run
from parlab.timeline import (
    CLOCK_SYNC,
    Timeline,
    covered,
    hidden_share,
    idle_share,
    load,
    merge,
    profiled,
    watched,
)

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


def _rank_trace(host: str, base_us: float, sync_us: float, events: list[dict]) -> dict:
    """One rank's file as the profiler writes it: times from `base_us` (on the host's clock)."""
    marks = [{"ph": "X", "pid": 7, "tid": 1, "name": CLOCK_SYNC, "ts": sync_us - base_us,
              "dur": 1}]
    return {"host_name": host, "baseTimeNanoseconds": base_us * 1e3,
            "traceEvents": marks + [{**e, "ts": e["ts"] - base_us} for e in events]}


def test_one_host_keeps_its_clock_and_hosts_align_on_their_first_mark(tmp_path):
    # on host a, rank 1 marked 500 us late (descheduled after the barrier); an event at the
    # same moment of host a's clock must land at the same time on both rows. Host b's clock
    # is 1 s off; its first mark is its 0.
    moment = [_event(0, "step", 5000, 10)]
    parts = {"r0": _rank_trace("a", 100, 1000, moment),
             "r1": _rank_trace("a", 300, 1500, moment),
             "r2": _rank_trace("b", 7, 1_001_000, [_event(0, "step", 1_005_000, 10)])}
    files = []
    for name, trace in parts.items():
        files.append(tmp_path / f"{name}.json")
        files[-1].write_text(json.dumps(trace))
    tl = load(merge(files, tmp_path / "out.json"))
    assert [r.start for r in tl.ranges(prefix="step")] == pytest.approx([4e-3, 4e-3, 4e-3])


def test_messages_move_to_tracks_where_they_nest(tmp_path):
    # two receives posted together, overlapping each other and the compute range
    events = [_event(0, "compute", 100, 1000), _event(0, "gloo:recv", 50, 400),
              _event(0, "gloo:recv", 60, 2000), _event(0, "gloo:recv", 600, 100)]
    part = tmp_path / "r0.json"
    part.write_text(json.dumps(_rank_trace("a", 0, 0, events)))
    data = json.loads(merge([part], tmp_path / "out.json").read_text())
    tracks = {}
    for e in data["traceEvents"]:
        if e.get("ph") == "X" and e["name"] != CLOCK_SYNC:
            tracks.setdefault(e["tid"], []).append((e["name"], e["ts"]))
    assert tracks[0] == [("compute", 100)]  # left where it was
    recv_tracks = [sorted(v) for k, v in tracks.items() if k != 0]
    assert sorted(recv_tracks) == [[("gloo:recv", 50), ("gloo:recv", 600)],
                                   [("gloo:recv", 60)]]
    names = [e["args"]["name"] for e in data["traceEvents"] if e.get("name") == "thread_name"]
    assert sum(n.startswith("messages") for n in names) == 2


def test_nccl_messages_are_messages_too(tmp_path):
    """NCCL names its ranges with their peers ("nccl:recv 0<-1", "nccl:send 0->1")."""
    from parlab.cp.trace import TRANSFERS
    from parlab.timeline import in_flight

    names = ["nccl:recv 0<-1", "nccl:send 0->1", "nccl:recv 12<-3", "gloo:recv", "gloo:send"]
    assert all(in_flight(n) for n in names)
    assert not any(in_flight(n) for n in ("compute", "nccl:all_reduce", "recv F mb0 chunk0"))
    assert [bool(re.match(TRANSFERS, n)) for n in names] == [True, False, True, True, False]
    events = [_event(0, "compute", 100, 1000), _event(0, "nccl:recv 0<-1", 50, 400)]
    part = tmp_path / "r0.json"
    part.write_text(json.dumps(_rank_trace("a", 0, 0, events)))
    data = json.loads(merge([part], tmp_path / "out.json").read_text())
    tids = {e["name"]: e["tid"] for e in data["traceEvents"] if e.get("ph") == "X"}
    assert tids["compute"] == 0 and tids["nccl:recv 0<-1"] != 0  # on a message track


def test_hidden_share_and_windows_on_a_known_timeline():
    # rank 0 computes 0-4 s; its messages fly 1-3 (hidden) and 3-6 (1 s of 3 hidden);
    # rank 1 computes nothing while its message flies 0-2: hidden 3 of 7 s in flight.
    events = [_event(0, "ring step 0 compute", 0, 4e6), _event(0, "gloo:recv", 1e6, 2e6),
              _event(0, "gloo:recv", 3e6, 3e6), _event(1, "gloo:recv", 0, 2e6),
              _event(1, "ring step 0 wait", 0, 2e6)]
    events += [{"ph": "M", "name": "process_name", "pid": p, "args": {"name": f"rank {p}"}}
               for p in (0, 1)]
    tl = Timeline({"traceEvents": events})
    assert hidden_share(tl, transfers="^gloo:recv$", compute="compute$") == pytest.approx(3 / 7)
    assert hidden_share(tl, transfers="^gloo:recv$", compute="compute$", ranks=[0]) == (
        pytest.approx(3 / 5))
    assert [r.name for r in tl.ranges(match=r"step \d+", rank=1)] == ["ring step 0 wait"]
    assert len(tl.ranges(prefix="gloo", within=(0.5, 3.5))) == 1  # starts and ends inside
    assert covered(tl.ranges(rank=0, prefix="gloo"), tl.ranges(rank=1)) == pytest.approx(1.0)


class _Handle:
    def __init__(self, error: Exception | None = None) -> None:
        self.error, self.thread = error, None

    def wait(self) -> bool:
        import threading
        import time

        time.sleep(0.01)
        self.thread = threading.current_thread().name
        if self.error is not None:
            raise self.error
        return True


def test_watched_waits_on_a_thread_of_its_own_only_under_a_profile(tmp_path, capfd):
    plain = [_Handle()]
    assert watched(plain) == plain  # no profile: the handles themselves, nothing started
    with profiled(tmp_path / "p.json"):
        handles = [_Handle(), _Handle()]
        (job,) = watched(handles)
        assert job.wait() is True
        assert {h.thread for h in handles} == {"parlab message watcher"}
        (failing,) = watched([_Handle(RuntimeError("peer gone"))])
        with pytest.raises(RuntimeError, match="peer gone"):
            failing.wait()
    assert "profiler_start" not in capfd.readouterr().err  # libkineto's chatter silenced
