r"""Profiler timelines of real runs: one Chrome trace per run, one row per rank.

    run(fn, 4, trace="run.json")          # every rank under torch.profiler, merged into one file
    tl = load("run.json")
    tl.ranges(rank=0, prefix="F ")        # what rank 0 did, as (name, start, end) in seconds
    idle_share(tl, ("F ", "B ", "W "))    # the bubble, measured: idle time / (ranks x span)

Open the file in Perfetto (https://ui.perfetto.dev, "Open trace file") or chrome://tracing:
each rank is a process row; inside it, the ranges the code names with
`torch.profiler.record_function` ("F mb3 chunk1", "allreduce bucket 2", "ring step 1 recv"),
every collective and point-to-point call the tracer (`parlab.comm`) sees as a range of its own
("comm all_reduce (1024,) float32"), and the aten operators underneath. A message is a range
too: gloo (and NCCL) mark each send and receive from the moment it is posted until it is
complete ("gloo:recv"), which overlaps whatever the rank computes meanwhile, so the merge puts
those ranges on tracks of their own, "messages" under each rank. gloo sees a message complete
only when someone waits for it: a receive waited for late ends late. `watched(handles)` waits
on a thread of its own while a profile is recorded, so that such ranges end when the message
arrived (the ring does it for its transfers). `hidden_share` measures how much of the
messages' time the rank spent computing. With `cuda=True` (what `run` passes under NCCL) the
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

import bisect
import contextlib
import json
import os
import queue
import re
import sys
import threading
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch.distributed as dist
from torch.profiler import ProfilerActivity, profile, record_function

from parlab import comm

__all__ = ["CLOCK_SYNC", "IN_FLIGHT", "Range", "Timeline", "profiled", "watched", "merge",
           "load", "idle_share", "busy_share", "covered", "hidden_share"]

CLOCK_SYNC = "parlab clock sync"
_watcher: list[_Watcher] = []  # the one running while profiled() records this process
IN_FLIGHT = ("gloo:send", "gloo:recv", "nccl:send", "nccl:recv")  # posted, then completed later
_LANE_TID = 1_000_000  # tids of the "messages" tracks: far from any thread id
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
    watcher = _Watcher()  # started before the clock mark: starting a thread can take ms
    prof = profile(activities=activities)
    try:
        with _quiet_stderr():  # libkineto announces its start and stop there, every time
            prof.start()
        try:
            if dist.is_initialized():
                dist.barrier()
            with record_function(CLOCK_SYNC):
                pass
            _watcher[:] = [watcher]
            yield
        finally:
            _watcher.clear()
            watcher.stop()
            with _quiet_stderr():
                prof.stop()
        prof.export_chrome_trace(str(path))
    finally:
        watcher.stop()
        comm.remove_listener(_comm_ranges)


@contextlib.contextmanager
def _quiet_stderr() -> Iterator[None]:
    """File descriptor 2 to /dev/null for the duration (what C++ prints there included)."""
    sys.stderr.flush()
    saved, devnull = os.dup(2), os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, 2)
    try:
        yield
    finally:
        os.dup2(saved, 2)
        os.close(saved)
        os.close(devnull)


class _Watched:
    """Posted messages, waited for by the watcher thread; `wait()` returns once it has."""

    def __init__(self, handles: Sequence[Any]) -> None:
        self.handles, self.done = list(handles), threading.Event()
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            for handle in self.handles:
                handle.wait()
        except BaseException as exc:  # noqa: BLE001 - handed to the waiting rank
            self.error = exc
        self.done.set()

    def wait(self) -> bool:
        self.done.wait()
        if self.error is not None:
            raise self.error
        return True

    def is_completed(self) -> bool:
        return self.done.is_set()


class _Watcher:
    """One thread that waits for posted messages, in the order they were handed over."""

    def __init__(self) -> None:
        self.jobs: queue.SimpleQueue[_Watched | None] = queue.SimpleQueue()
        self.thread = threading.Thread(target=self._loop, name="parlab message watcher",
                                       daemon=True)
        self.thread.start()

    def _loop(self) -> None:
        while (job := self.jobs.get()) is not None:
            job.run()

    def stop(self) -> None:
        if self.thread.is_alive():
            self.jobs.put(None)
            self.thread.join()


def watched(handles: Sequence[Any]) -> list[Any]:
    """While `profiled` records: one handle for all of `handles` (what isend and irecv
    return), which a thread of its own waits for from now on, so that the trace's message
    ranges end when the messages arrive, not when the rank gets round to waiting. Otherwise:
    `handles`, unchanged."""
    if not _watcher or not handles:
        return list(handles)
    job = _Watched(handles)
    _watcher[0].jobs.put(job)
    return [job]


def merge(parts: Sequence[str | os.PathLike], out: str | os.PathLike) -> Path:
    """One trace from one file per rank (rank = position in `parts`), clocks aligned.

    Ranges of messages (`IN_FLIGHT`) overlap the rank's other ranges without nesting in them,
    which Perfetto cannot draw on one track: they move to "messages" tracks of the rank, as
    many as overlap at once."""
    traces = [json.loads(Path(part).read_text()) for part in parts]
    zeros = _zeros(traces, parts)
    events: list[dict[str, Any]] = []
    for rank, (trace, zero) in enumerate(zip(traces, zeros, strict=True)):
        raw = trace["traceEvents"]
        flying: list[dict[str, Any]] = []
        for e in raw:  # moved in place: a trace holds tens of thousands of events
            ph = e.get("ph")
            if ph == "M":  # the rank's own process/thread names: replaced below
                if e.get("name") == "thread_name":
                    e["pid"] = rank
                    events.append(e)
                continue
            if ph not in ("X", "i", "I") or "ts" not in e:
                continue
            e["pid"], e["ts"] = rank, e["ts"] - zero
            (flying if ph == "X" and e.get("name") in IN_FLIGHT else events).append(e)
        events += _lanes(flying, rank)
        events.append({"ph": "M", "name": "process_name", "pid": rank, "tid": 0,
                       "args": {"name": f"rank {rank}"}})
        events.append({"ph": "M", "name": "process_sort_index", "pid": rank, "tid": 0,
                       "args": {"sort_index": rank}})
    out = Path(out)
    out.write_text(json.dumps({"traceEvents": events, "displayTimeUnit": "ms"},
                              separators=(",", ":")))
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
    """Messages, each on the first "messages" track free at its start."""
    ends: list[float] = []  # per lane: when its last range ends
    placed = []
    for e in sorted(flying, key=lambda e: e["ts"]):
        lane = next((k for k, end in enumerate(ends) if end <= e["ts"]), len(ends))
        if lane == len(ends):
            ends.append(0.0)
            placed.append({"ph": "M", "name": "thread_name", "pid": rank,
                           "tid": _LANE_TID + lane,
                           "args": {"name": f"messages {lane}: posted until complete"}})
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
        self._by_rank: dict[int, list[Range]] = {}
        for e in self.events:
            if e.get("ph") == "X" and "dur" in e and e.get("name") != CLOCK_SYNC:
                self._by_rank.setdefault(e["pid"], []).append(
                    Range(e["pid"], e["name"], e["ts"] / 1e6, (e["ts"] + e["dur"]) / 1e6))
        for found in self._by_rank.values():
            found.sort(key=lambda r: r.start)
        self._starts = {k: [r.start for r in found] for k, found in self._by_rank.items()}

    def ranges(self, *, rank: int | None = None, prefix: str | tuple[str, ...] = "",
               match: str | None = None,
               within: tuple[float, float] | None = None) -> list[Range]:
        """Ranges of `rank` (every rank: None, rank by rank) whose name starts with `prefix`
        (and, given `match`, contains a match of that regular expression), by start;
        `within=(t0, t1)` keeps those that start and end inside that window."""
        pattern = None if match is None else re.compile(match)
        out = []
        for k in sorted(self._by_rank) if rank is None else [rank]:
            found = self._by_rank.get(k, [])
            lo, hi = 0, len(found)
            if within is not None:
                lo = bisect.bisect_left(self._starts[k], within[0])
                hi = bisect.bisect_right(self._starts[k], within[1])
            out += [r for r in found[lo:hi] if r.name.startswith(prefix)
                    and (pattern is None or pattern.search(r.name))
                    and (within is None or r.end <= within[1])]
        return out

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
