r"""Profiler timelines of real runs: one Chrome trace per run, one row per rank.

    run(fn, 4, trace="run.json")          # every rank under torch.profiler, merged into one file
    tl = load("run.json")
    tl.ranges(rank=0, prefix="F ")        # what rank 0 did, as (name, start, end) in seconds
    idle_share(tl, ("F ", "B ", "W "))    # the bubble, measured: idle time / (ranks x span)

Open the file in Perfetto (https://ui.perfetto.dev, "Open trace file") or chrome://tracing:
each rank is a process row; inside it, the ranges the code names with
`torch.profiler.record_function` ("F mb3 chunk1", "allreduce bucket 2", "ring step 1 recv"),
every collective and point-to-point call the tracer (`parlab.comm`) sees as a range of its own
("comm all_reduce (1024,) float32"), and the aten operators underneath.

How the ranks' clocks are aligned: each rank, after a barrier, marks a range named
`CLOCK_SYNC`; the merge shifts each rank's events so that its mark starts at 0. Ranks leave a
barrier within microseconds of each other on one machine (within a network round trip across
nodes), so the rows line up to about that.
"""

from __future__ import annotations

import contextlib
import json
import os
import threading
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch.distributed as dist
from torch.profiler import ProfilerActivity, profile, record_function

from parlab import comm

__all__ = ["CLOCK_SYNC", "Range", "Timeline", "profiled", "merge", "load", "idle_share",
           "busy_share"]

CLOCK_SYNC = "parlab clock sync"
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
    """One trace from one file per rank (rank = position in `parts`), clocks aligned."""
    events: list[dict[str, Any]] = []
    for rank, part in enumerate(parts):
        raw = json.loads(Path(part).read_text())["traceEvents"]
        marks = [e["ts"] for e in raw if e.get("name") == CLOCK_SYNC]
        if not marks:
            raise ValueError(f"{part} has no {CLOCK_SYNC!r} mark: was it made by profiled()?")
        zero = min(marks)
        for e in raw:
            if e.get("ph") not in ("X", "i", "I", "M") or "ts" not in e and e.get("ph") != "M":
                continue
            if e.get("ph") == "M":  # the rank's own process/thread names: replaced below
                if e.get("name") == "thread_name":
                    events.append({**e, "pid": rank})
                continue
            events.append({**e, "pid": rank, "ts": e["ts"] - zero})
        events.append({"ph": "M", "name": "process_name", "pid": rank, "tid": 0,
                       "args": {"name": f"rank {rank}"}})
        events.append({"ph": "M", "name": "process_sort_index", "pid": rank, "tid": 0,
                       "args": {"sort_index": rank}})
    out = Path(out)
    out.write_text(json.dumps({"traceEvents": events, "displayTimeUnit": "ms"}))
    return out


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

    def ranges(self, *, rank: int | None = None,
               prefix: str | tuple[str, ...] = "") -> list[Range]:
        """Ranges of `rank` (every rank: None) whose name starts with `prefix`, by start."""
        return [r for r in self._all if (rank is None or r.rank == rank)
                and r.name.startswith(prefix) and r.name != CLOCK_SYNC]

    def span(self, prefix: str | tuple[str, ...] = "") -> tuple[float, float]:
        """(first start, last end) over every rank's ranges named `prefix...`."""
        found = self.ranges(prefix=prefix)
        if not found:
            raise ValueError(f"the trace has no range whose name starts with {prefix!r}")
        return min(r.start for r in found), max(r.end for r in found)


def load(path: str | Path) -> Timeline:
    """Read a trace written by `merge` (or `parlab.launch.run(..., trace=path)`)."""
    return Timeline(json.loads(Path(path).read_text()))


def busy_share(timeline: Timeline, work: str | tuple[str, ...],
               ranks: Iterable[int] | None = None) -> float:
    """Share of ranks × span spent inside ranges named `work...` (the span runs from the
    first such range to the last, over all ranks)."""
    start, end = timeline.span(work)
    chosen = list(timeline.ranks if ranks is None else ranks)
    busy = sum(r.seconds for rank in chosen for r in _outermost(timeline.ranges(rank=rank,
                                                                               prefix=work)))
    return busy / (len(chosen) * (end - start))


def idle_share(timeline: Timeline, work: str | tuple[str, ...],
               ranks: Iterable[int] | None = None) -> float:
    """The measured bubble: 1 - busy_share (GPipe's accounting, a share of the step)."""
    return 1.0 - busy_share(timeline, work, ranks)


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
