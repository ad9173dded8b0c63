"""Merging: the ranks' traces into one Chrome trace, one process row per rank, aligned on the
hosts' clocks, messages on tracks of their own (see parlab.timeline)."""

from __future__ import annotations

import json
import os
import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from parlab.timeline.record import CLOCK_SYNC

__all__ = ["IN_FLIGHT", "in_flight", "merge"]

# A message's range, posted then completed later: gloo's "gloo:recv", NCCL's "nccl:recv 0<-1"
# and "nccl:send 0->1" (its peers in the name).
IN_FLIGHT = r"^(gloo|nccl):(send|recv)( \d+(<-|->)\d+)?$"


def in_flight(name: object) -> bool:
    """Whether a range named `name` is a message in flight (`IN_FLIGHT`)."""
    return isinstance(name, str) and re.match(IN_FLIGHT, name) is not None
_LANE_TID = 1_000_000  # tids of the "messages" tracks: far from any thread id


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
            (flying if ph == "X" and in_flight(e.get("name")) else events).append(e)
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
