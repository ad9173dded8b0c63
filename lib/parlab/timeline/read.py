"""Reading: a merged trace as ranges per rank, and what is measured from them (the idle share,
coverage, the share of messages hidden behind compute; see parlab.timeline)."""

from __future__ import annotations

import bisect
import json
import os
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from parlab.timeline.record import CLOCK_SYNC

__all__ = ["Range", "Timeline", "load", "idle_share", "busy_share", "covered", "hidden_share"]


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
