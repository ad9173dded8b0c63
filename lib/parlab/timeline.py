r"""Profiler timelines of real runs: one Chrome trace per run, one row per rank.

    run(fn, 4, trace="run.json")          # every rank under torch.profiler, merged into one file
    tl = load("run.json")
    tl.ranges(rank=0, prefix="F ")        # what rank 0 did, as (name, start, end) in seconds
    idle_share(tl, ("F ", "B ", "W "))    # the bubble, measured: idle time / (ranks x span)

Open the file in Perfetto (https://ui.perfetto.dev, "Open trace file") or chrome://tracing:
each rank is a process row; inside it, the ranges the code names with
`torch.profiler.record_function` ("F mb3 chunk1", "allreduce bucket 2", "ring step 1 recv"),
every collective and point-to-point call the tracer (`parlab.comm`) sees as a range of its own
("comm all_reduce (1024,) float32"), and the aten operators underneath. A message in flight is
a range too: gloo (and NCCL) mark each send and receive from the moment it is posted until it
completes ("gloo:recv"), which overlaps whatever the rank computes meanwhile, so the merge puts
those ranges on tracks of their own, "in flight" under each rank. `hidden_share` measures how
much of that time the rank spent computing. With `cuda=True` (what `run` passes under NCCL) the
GPU's kernels and copies are recorded too, on one track per CUDA stream.

How the ranks' clocks are aligned: each rank, after a barrier, marks a range named
`CLOCK_SYNC`. The profiler stamps events with the host's wall clock (its trace says which host
and from which base), so the ranks of one host share one clock: the merge keeps it, with 0 at
the host's earliest mark, and the rows line up to the microsecond. Hosts' clocks differ, so
each host's earliest mark is its 0: ranks leave a barrier within a network round trip of each
other, and the hosts line up to about that. (A per-rank mark would be worse on one host: a
rank descheduled between the barrier and its mark, common on a busy machine, would shift its
whole row by milliseconds.)
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import threading
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch.distributed as dist
from torch.profiler import ProfilerActivity, profile, record_function

from parlab import comm

__all__ = ["CLOCK_SYNC", "IN_FLIGHT", "Range", "Timeline", "profiled", "merge", "load",
           "idle_share", "busy_share", "covered", "hidden_share"]

CLOCK_SYNC = "parlab clock sync"
IN_FLIGHT = ("gloo:send", "gloo:recv", "nccl:send", "nccl:recv")  # posted, then completed later
_LANE_TID = 1_000_000  # tids of the "in flight" tracks: far from any thread id
_stacks = threading.local()


def _comm_ranges(phase: str, event: comm.Event) -> None:
    """A tracer listener: each communication call becomes a profiler range."""
    stack = getattr(_stacks, "open", None)
    if stack is None:
        stack = _stacks.open = []
    if phase == "start":
        shape = "x".join(map(str, event.shape)) or "-"
        rf = record_function(f"comm {event.kind} ({shape}) {event.dtype}".rstrip())
        rf.__enter__()
        stack.append(rf)
    elif stack:
        stack.pop().__exit__(None, None, None)


@contextlib.contextmanager
def profiled(path: str | Path, *, cuda: bool = False) -> Iterator[None]:
    """Profile this process into the Chrome trace `path`; comm calls become ranges too.

    Call it inside a rank, after the process group exists: it starts with a barrier and the
    `CLOCK_SYNC` mark the merge aligns on."""
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
    comm.add_listener(_comm_ranges)
    try:
        with profile(activities=activities) as prof:
            if dist.is_initialized():
                dist.barrier()
            with record_function(CLOCK_SYNC):
                pass
            yield
        prof.export_chrome_trace(str(path))
    finally:
        comm.remove_listener(_comm_ranges)


def merge(parts: Sequence[str | os.PathLike], out: str | os.PathLike) -> Path:
    """One trace from one file per rank (rank = position in `parts`), clocks aligned.

    Ranges of messages in flight (`IN_FLIGHT`) overlap the rank's other ranges without
    nesting in them, which Perfetto cannot draw on one track: they move to "in flight" tracks
    of the rank, as many as overlap at once."""
    traces = [json.loads(Path(part).read_text()) for part in parts]
    zeros = _zeros(traces, parts)
    events: list[dict[str, Any]] = []
    for rank, (trace, zero) in enumerate(zip(traces, zeros, strict=True)):
        raw = trace["traceEvents"]
        flying: list[dict[str, Any]] = []
        for e in raw:
            if e.get("ph") not in ("X", "i", "I", "M") or "ts" not in e and e.get("ph") != "M":
                continue
            if e.get("ph") == "M":  # the rank's own process/thread names: replaced below
                if e.get("name") == "thread_name":
                    events.append({**e, "pid": rank})
                continue
            moved = {**e, "pid": rank, "ts": e["ts"] - zero}
            (flying if e.get("ph") == "X" and e.get("name") in IN_FLIGHT else events).append(moved)
        events += _lanes(flying, rank)
        events.append({"ph": "M", "name": "process_name", "pid": rank, "tid": 0,
                       "args": {"name": f"rank {rank}"}})
        events.append({"ph": "M", "name": "process_sort_index", "pid": rank, "tid": 0,
                       "args": {"sort_index": rank}})
    out = Path(out)
    out.write_text(json.dumps({"traceEvents": events, "displayTimeUnit": "ms"}))
    return out


def _zeros(traces: list[dict[str, Any]], parts: Sequence[Any]) -> list[float]:
    """Per rank, the timestamp that becomes 0: its host's earliest clock-sync mark, on the
    rank's own time base (the profiler writes times from `baseTimeNanoseconds`)."""
    base = [t.get("baseTimeNanoseconds", 0) / 1e3 for t in traces]  # microseconds
    marks = []
    for trace, part, b in zip(traces, parts, base, strict=True):
        found = [e["ts"] for e in trace["traceEvents"] if e.get("name") == CLOCK_SYNC]
        if not found:
            raise ValueError(f"{part} has no {CLOCK_SYNC!r} mark: was it made by profiled()?")
        marks.append(min(found) + b)  # on the host's wall clock
    hosts = [t.get("host_name", f"rank {k}") for k, t in enumerate(traces)]
    first = {h: min(m for m, g in zip(marks, hosts, strict=True) if g == h) for h in hosts}
    return [first[h] - b for h, b in zip(hosts, base, strict=True)]


def _lanes(flying: list[dict[str, Any]], rank: int) -> list[dict[str, Any]]:
    """Messages in flight, each on the first "in flight" track free at its start."""
    ends: list[float] = []  # per lane: when its last range ends
    placed = []
    for e in sorted(flying, key=lambda e: e["ts"]):
        lane = next((k for k, end in enumerate(ends) if end <= e["ts"]), len(ends))
        if lane == len(ends):
            ends.append(0.0)
            placed.append({"ph": "M", "name": "thread_name", "pid": rank,
                           "tid": _LANE_TID + lane,
                           "args": {"name": f"in flight {lane}: messages posted, not done"}})
            placed.append({"ph": "M", "name": "thread_sort_index", "pid": rank,
                           "tid": _LANE_TID + lane, "args": {"sort_index": _LANE_TID + lane}})
        ends[lane] = e["ts"] + e.get("dur", 0.0)
        placed.append({**e, "tid": _LANE_TID + lane})
    return placed


@dataclass(frozen=True)
class Range:
    """One named range of one rank, in seconds from the clock-sync mark."""

    rank: int
    name: str
    start: float
    end: float

    @property
    def seconds(self) -> float:
        return self.end - self.start


class Timeline:
    """A merged trace, read back: the named ranges of every rank."""

    def __init__(self, trace: dict[str, Any]) -> None:
        self.events = trace["traceEvents"]
        self.ranks = sorted({e["pid"] for e in self.events if e.get("name") == "process_name"})
        self._all = sorted((Range(e["pid"], e["name"], e["ts"] / 1e6, (e["ts"] + e["dur"]) / 1e6)
                            for e in self.events if e.get("ph") == "X" and "dur" in e),
                           key=lambda r: (r.rank, r.start))

    def ranges(self, *, rank: int | None = None, prefix: str | tuple[str, ...] = "",
               match: str | None = None,
               within: tuple[float, float] | None = None) -> list[Range]:
        """Ranges of `rank` (every rank: None) whose name starts with `prefix` (and, given
        `match`, contains a match of that regular expression), by start; `within=(t0, t1)`
        keeps those that start and end inside that window."""
        pattern = None if match is None else re.compile(match)
        return [r for r in self._all if (rank is None or r.rank == rank)
                and r.name.startswith(prefix) and r.name != CLOCK_SYNC
                and (pattern is None or pattern.search(r.name))
                and (within is None or within[0] <= r.start and r.end <= within[1])]

    def span(self, prefix: str | tuple[str, ...] = "", *, match: str | None = None,
             within: tuple[float, float] | None = None) -> tuple[float, float]:
        """(first start, last end) over every rank's ranges named `prefix...` (`ranges`)."""
        found = self.ranges(prefix=prefix, match=match, within=within)
        if not found:
            raise ValueError(f"the trace has no range whose name starts with {prefix!r}"
                             + (f" and matches {match!r}" if match else "")
                             + (f" within {within}" if within else ""))
        return min(r.start for r in found), max(r.end for r in found)


def load(path: str | os.PathLike) -> Timeline:
    """Read a trace written by `merge` (or `parlab.launch.run(..., trace=path)`)."""
    return Timeline(json.loads(Path(path).read_text()))


def busy_share(timeline: Timeline, work: str | tuple[str, ...],
               ranks: Iterable[int] | None = None, *,
               within: tuple[float, float] | None = None) -> float:
    """Share of ranks × span spent inside ranges named `work...` (the span runs from the
    first such range to the last, over all ranks; `within` restricts both to a window)."""
    start, end = timeline.span(work, within=within)
    chosen = list(timeline.ranks if ranks is None else ranks)
    busy = sum(r.seconds for rank in chosen for r in _outermost(
        timeline.ranges(rank=rank, prefix=work, within=within)))
    return busy / (len(chosen) * (end - start))


def idle_share(timeline: Timeline, work: str | tuple[str, ...],
               ranks: Iterable[int] | None = None, *,
               within: tuple[float, float] | None = None) -> float:
    """The measured bubble: 1 - busy_share (GPipe's accounting, a share of the step)."""
    return 1.0 - busy_share(timeline, work, ranks, within=within)


def covered(ranges: Sequence[Range], cover: Sequence[Range]) -> float:
    """Seconds of `ranges` (their union) that lie inside the union of `cover`."""
    total = 0.0
    merged = _outermost(sorted(cover, key=lambda r: r.start))
    for r in _outermost(sorted(ranges, key=lambda r: r.start)):
        total += sum(max(0.0, min(r.end, c.end) - max(r.start, c.start)) for c in merged)
    return total


def hidden_share(timeline: Timeline, *, transfers: str, compute: str,
                 ranks: Iterable[int] | None = None,
                 within: tuple[float, float] | None = None) -> float:
    """Share of the time messages were in flight that the rank spent computing: the part of
    the transfers hidden behind compute (1: fully overlapped; 0: the rank waited for each).

    transfers, compute: regular expressions for the ranges' names (`Timeline.ranges(match=)`),
    for example "^gloo:recv$" and "^ring step \\d+ compute$"; summed over `ranks`."""
    hidden = flying = 0.0
    for rank in timeline.ranks if ranks is None else ranks:
        moving = timeline.ranges(rank=rank, match=transfers, within=within)
        hidden += covered(moving, timeline.ranges(rank=rank, match=compute, within=within))
        flying += sum(r.seconds for r in _outermost(moving))
    if flying <= 0:
        raise ValueError(f"no time in flight: the trace has no range matching {transfers!r}")
    return hidden / flying


def _outermost(ranges: list[Range]) -> list[Range]:
    """Drop ranges nested in an earlier one (a range inside a range is not counted twice)."""
    kept: list[Range] = []
    for r in ranges:
        if kept and r.start < kept[-1].end:
            if r.end > kept[-1].end:
                kept[-1] = Range(r.rank, kept[-1].name, kept[-1].start, r.end)
            continue
        kept.append(r)
    return kept
