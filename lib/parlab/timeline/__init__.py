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

from parlab.timeline.merge import IN_FLIGHT, in_flight, merge
from parlab.timeline.read import (
           Range,
           Timeline,
           busy_share,
           covered,
           hidden_share,
           idle_share,
           load,
)
from parlab.timeline.record import CLOCK_SYNC, profiled, watched

__all__ = ["CLOCK_SYNC", "IN_FLIGHT", "in_flight", "Range", "Timeline", "profiled", "watched",
           "merge", "load", "idle_share", "busy_share", "covered", "hidden_share"]
