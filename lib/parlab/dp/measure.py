"""One training step of a data-parallel model, measured in a rank: the collectives its forward
and its backward make (parlab.comm's tracer, ring bytes) and the memory it holds (PyTorch's
`MemTracker`, torch.distributed._tools: every tensor storage alive on the rank's device,
parameters, gradients, what autograd saved and temporaries alike).

The same measurement for the course's FSDP layer and for FSDP2's `fully_shard`, so module 01
and benchmarks/bench_fsdp.py compare them side by side:

    m = measure_step(model, x)               # in a rank of parlab.launch.run
    m.forward, m.backward                    # [(kind, payload bytes, wire bytes)]
    m.turn - m.before                        # bytes still held between forward and backward
    m.peak                                   # the most held at once during the step
    m.output                                 # y, on the CPU

`MemTracker` is a private PyTorch tool (torch.distributed._tools.mem_tracker, torch 2.13): it
counts storages through a dispatch mode, so it sees FSDP2's gathered parameters, freed by
resizing their storage to 0, as freed.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from parlab import comm

__all__ = ["StepMeasure", "measure_step", "calls"]

_SHORT = {"all_gather_into_tensor": "all_gather", "all_gather_single": "all_gather",
          "reduce_scatter_tensor": "reduce_scatter", "reduce_scatter_single": "reduce_scatter"}


@dataclass(frozen=True)
class StepMeasure:
    """What one rank's step cost: calls as (kind, payload bytes, wire bytes); memory in bytes."""

    forward: list[tuple[str, int, float]]
    backward: list[tuple[str, int, float]]
    before: int  # held before the forward (the sharded parameters, the input)
    turn: int  # held after the forward, before the backward
    peak: int  # the most held at once, forward and backward
    output: torch.Tensor | None = None  # y, detached, on the CPU

    @property
    def wire_bytes(self) -> float:
        return sum(w for _, _, w in self.forward + self.backward)


def calls(events: Iterator[Any] | list[Any]) -> list[tuple[str, int, float]]:
    """Traced events as (kind, payload bytes, wire bytes), the *_tensor / *_single forms named
    as their list forms (all_gather, reduce_scatter)."""
    return [(_SHORT.get(e.kind, e.kind), e.nbytes, e.wire_bytes) for e in events]


def _total(snapshot: dict) -> int:
    return int(sum(per_device.get("Total", 0) for per_device in snapshot.values()))


def measure_step(model: nn.Module, x: torch.Tensor,
                 upstream: torch.Tensor | None = None) -> StepMeasure:
    """Forward `model(x)`, then backward of sum(y * upstream) (ones when None), traced and
    tracked (see the module docstring)."""
    from torch.distributed._tools.mem_tracker import MemTracker

    tracker = MemTracker()
    tracker.track_external(model, x)
    with tracker:
        before = _total(tracker.get_tracker_snapshot("current"))
        with comm.trace() as forward:
            y = model(x)
        turn = _total(tracker.get_tracker_snapshot("current"))
        grad = torch.ones_like(y) if upstream is None else upstream
        with comm.trace() as backward:
            (y * grad).sum().backward()
    peak = _total(tracker.get_tracker_snapshot("peak"))
    return StepMeasure(calls(forward.events), calls(backward.events), before, turn, peak,
                       y.detach().cpu().clone())
