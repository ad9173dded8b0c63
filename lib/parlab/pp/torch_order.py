r"""What `torch.distributed.pipelining` runs, written as parlab.pp's actions.

torch names an action by its *stage*: "2F0" is the forward of micro-batch 0 through stage 2.
Its kinds map onto parlab's `Action(kind, microbatch, chunk)` (the chunk from the stage and
the placement, `parlab.pp.rank_and_chunk`):

    torch "F"  forward                                   -> F
    torch "I"  backward for the input only (split)       -> B   (its W comes later)
    torch "W"  backward for the weights                  -> W
    torch "B"  full backward, input and weights at once  -> B, and W at once after it where
                                                            parlab's table splits backwards

A schedule object keeps a table, `pipeline_order` (rank -> actions, None an idle step), and
runs something else to do the work: `Schedule1F1B` runs a loop of its own, the multi-stage
schedules (`_PipelineScheduleRuntime`) run `pipeline_order_with_comms`, the table with sends
and receives put in. What ran is what the stages computed, so `recording()` wraps the three
methods every schedule calls on a stage (`forward_one_chunk`, `backward_one_chunk`,
`backward_weight_one_chunk`) and notes each call, in order, as it starts.

- `TORCH_SCHEDULES`: parlab's schedule name -> torch's class, the placement, whether parlab's
  table splits the backward (has W actions).
- `recording()`: a context manager yielding the list of `TorchCall`s made in this process.
- `executed_actions(calls, p, name)`: one rank's calls as parlab Actions.
- `stored_actions(schedule, p, name)`: a schedule object's own table, rank by rank, as Actions
  (idle steps dropped, an overlapped F&B unit as its two actions). In torch 2.13 the table of
  `Schedule1F1B` is wrong on the last rank (it starts at micro-batch 1 and ends at m); what
  runs is right.
- `first_difference(a, b)`: where two per-rank lists of actions first differ, in words.
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple

from parlab.pp.actions import Action, placed_rank

__all__ = ["TorchSchedule", "TORCH_SCHEDULES", "TorchCall", "recording", "executed_actions",
           "stored_actions", "first_difference", "torch_name"]


@dataclass(frozen=True)
class TorchSchedule:
    """How parlab's schedule `name` is built with torch's API."""

    cls: str  # the class in torch.distributed.pipelining
    placement: str  # "looped" (stage c p + r) or "v" (r and 2p - 1 - r)
    split: bool  # parlab's table has W actions (a torch full backward is then B and W)
    multi: bool  # the class takes a list of stages (one per chunk), else one stage


TORCH_SCHEDULES: dict[str, TorchSchedule] = {
    "gpipe": TorchSchedule("ScheduleGPipe", "looped", False, False),
    "1f1b": TorchSchedule("Schedule1F1B", "looped", False, False),
    "interleaved_1f1b": TorchSchedule("ScheduleInterleaved1F1B", "looped", False, True),
    # torch's ZB1P (Qi et al.'s ZB-H1 with interleaving); with one stage per rank it is ZB-H1
    "zb_h1": TorchSchedule("ScheduleInterleavedZeroBubble", "looped", True, True),
    "dualpipe_v": TorchSchedule("ScheduleDualPipeV", "v", True, True),
}


def torch_name(name: str) -> TorchSchedule:
    """TORCH_SCHEDULES[name], or a ValueError naming the choices."""
    if name not in TORCH_SCHEDULES:
        raise ValueError(f"no torch.distributed.pipelining schedule for {name!r}; choose one "
                         f"of {sorted(TORCH_SCHEDULES)}")
    return TORCH_SCHEDULES[name]


class TorchCall(NamedTuple):
    """One compute call a schedule made on a stage: torch's kind (F, I, W or B), the stage
    index, the micro-batch."""

    kind: str
    stage: int
    microbatch: int

    def __str__(self) -> str:  # torch's own notation: 2F0
        return f"{self.stage}{self.kind}{self.microbatch}"


_ACTIVE: list[list[TorchCall]] = []  # the lists of the recordings open in this process
_ORIGINALS: dict[str, Callable[..., Any]] = {}
_METHODS = (("forward_one_chunk", "F"), ("backward_one_chunk", ""),
            ("backward_weight_one_chunk", "W"))


def _recorded(original: Callable[..., Any], kind: str) -> Callable[..., Any]:
    @functools.wraps(original)
    def run(self: Any, chunk_id: int, *args: Any, **kwargs: Any) -> Any:
        k = kind
        if not k:  # backward_one_chunk(mb, loss=None, full_backward=True, ...)
            full = kwargs.get("full_backward", args[1] if len(args) > 1 else True)
            k = "B" if full else "I"
        for calls in _ACTIVE:
            calls.append(TorchCall(k, int(self.stage_index), int(chunk_id)))
        return original(self, chunk_id, *args, **kwargs)
    return run


@contextlib.contextmanager
def recording() -> Iterator[list[TorchCall]]:
    """Record every compute call torch's schedules make on a stage in this process, in the
    order they start, while the block runs (the methods are restored when the last recording
    closes)."""
    from torch.distributed.pipelining.stage import _PipelineStageBase

    if not _ORIGINALS:
        for method, kind in _METHODS:
            _ORIGINALS[method] = getattr(_PipelineStageBase, method)
            setattr(_PipelineStageBase, method, _recorded(_ORIGINALS[method], kind))
    calls: list[TorchCall] = []
    _ACTIVE.append(calls)
    try:
        yield calls
    finally:
        _ACTIVE.remove(calls)
        if not _ACTIVE:
            for method, original in _ORIGINALS.items():
                setattr(_PipelineStageBase, method, original)
            _ORIGINALS.clear()


def _as_actions(kind: str, stage: int, mb: int, p: int, spec: TorchSchedule) -> list[Action]:
    chunk = placed_rank(stage, p, spec.placement)[1]
    if kind == "F":
        return [Action("F", mb, chunk)]
    if kind == "W":
        return [Action("W", mb, chunk)]
    if kind == "I" or not spec.split:
        return [Action("B", mb, chunk)]
    return [Action("B", mb, chunk), Action("W", mb, chunk)]  # a full backward, split as B W


def executed_actions(calls: Sequence[TorchCall], p: int, name: str) -> list[Action]:
    """One rank's recorded calls as parlab Actions (schedule `name`'s placement and split)."""
    spec = torch_name(name)
    return [a for c in calls for a in _as_actions(c.kind, c.stage, c.microbatch, p, spec)]


def stored_actions(schedule: Any, p: int, name: str) -> list[list[Action]]:
    """The table a torch schedule object stores (`pipeline_order`), rank by rank, as Actions:
    idle steps (None) and non-compute actions (sends, REDUCE_GRAD) left out, an overlapped F&B
    unit as its forward and its backward."""
    spec = torch_name(name)
    table = getattr(schedule, "pipeline_order", None) or {}
    out: list[list[Action]] = []
    for rank in range(p):
        row: list[Action] = []
        for a in table.get(rank, []):
            if a is None:
                continue
            for sub in (a.sub_actions or (a,)):
                kind = sub.computation_type.value
                if kind in ("F", "I", "W", "B"):
                    row += _as_actions(kind, sub.stage_index, sub.microbatch_index, p, spec)
        out.append(row)
    return out


def first_difference(mine: Sequence[Sequence[Action]], theirs: Sequence[Sequence[Action]],
                     *, names: tuple[str, str] = ("the first", "the second")) -> str | None:
    """Where two schedules (one list per rank) first differ, in words; None if equal."""
    for r, (a, b) in enumerate(zip(mine, theirs, strict=True)):
        for i, (x, y) in enumerate(zip(a, b, strict=False)):
            if x != y:
                return f"rank {r}, position {i}: {names[0]} has {x}, {names[1]} {y}"
        if len(a) != len(b):
            i = min(len(a), len(b))
            more, extra = (names[0], a[i]) if len(a) > len(b) else (names[1], b[i])
            return (f"rank {r}: {names[0]} has {len(a)} actions, {names[1]} {len(b)} "
                    f"({more} goes on with {extra} at position {i})")
    return None
