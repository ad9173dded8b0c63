r"""What a pipeline schedule is made of: actions, and where each rank's stages sit.

    Action("F", 3)            forward of microbatch 3 through this rank's (only) chunk
    Action("B", 3, chunk=1)   backward of microbatch 3 through this rank's chunk 1
    Action("W", 3)            the weight-gradient half of a split backward (zero bubble)

A schedule is one list of actions per rank (`Schedule`). Which stage a rank's chunk is, is
the *placement*, one of `PLACEMENTS`:

- "looped" (every schedule but DualPipe-V): rank r's chunk c is stage $c\,p + r$, so a
  microbatch visits ranks 0, 1, ..., p-1, 0, 1, ... (p-1 -> 0 between chunks);
- "v" (DualPipe-V): each rank holds two chunks, chunk 0 is stage r and chunk 1 is stage
  $2p-1-r$. A microbatch goes down the ranks 0 -> p-1 through stages 0..p-1, turns on rank
  p-1 (stages p-1 and p are both there: no message), and comes back up p-1 -> 0 through
  stages p..2p-1; the loss is computed on rank 0, which also holds stage 0.

`stage_of(rank, chunk, p, placement=...)` and `rank_and_chunk(stage, p, placement=...)` say
it in both directions. A plain list of lists is a looped schedule; `PlacedSchedule` is a list
that carries its placement and, for DualPipe-V, which consecutive actions of a rank form one
overlapped forward-and-backward unit (`overlapped[r]`: (start, stop) positions of rank r's
list). `placement_of` and `overlapped_units` read them from any schedule.

The executor, the dependencies and the simulator call `placed_stage` / `placed_rank` (the
same maps), so that a graded check can refuse the public `stage_of` while parlab's own
executor runs.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

__all__ = ["KINDS", "PLACEMENTS", "Action", "Schedule", "ScheduleError", "PlacedSchedule",
           "stage_of", "rank_and_chunk", "placement_of", "overlapped_units", "placed_stage",
           "placed_rank", "label"]

KINDS = ("F", "B", "W")
PLACEMENTS = ("looped", "v")


@dataclass(frozen=True)
class Action:
    """One unit of work on one rank: kind "F", "B" or "W", a microbatch and a chunk."""

    kind: str
    microbatch: int
    chunk: int = 0

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ValueError(f"Action kind must be one of {KINDS}, got {self.kind!r}")
        for name in ("microbatch", "chunk"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise ValueError(f"Action {name} must be an int >= 0, got {value!r}")

    def __str__(self) -> str:  # F3, or F3.1 for chunk 1
        return f"{self.kind}{self.microbatch}" + (f".{self.chunk}" if self.chunk else "")

    def __repr__(self) -> str:
        return f"Action({self.kind!r}, {self.microbatch}" + (
            f", chunk={self.chunk})" if self.chunk else ")")


Schedule = list[list[Action]]  # schedule[rank] = that rank's actions, in order


class ScheduleError(ValueError):
    """A schedule that cannot run: a broken dependency, a missing action, or a deadlock."""


class PlacedSchedule(list):
    """A schedule (one list of Actions per rank) that says where its stages live.

    `placement`: "looped" or "v" (module docstring). `overlapped[r]`: (start, stop) position
    ranges of rank r's list, each one unit that a GPU runs as an overlapped forward and
    backward (DualPipe's F&B: the forward of one chunk and the full backward, B then W, of
    another). Equal to a plain list with the same actions; copies made with list() or
    [list(o) for o in s] lose both attributes and read as looped."""

    def __init__(self, ranks: Iterable[list[Action]], *, placement: str = "looped",
                 overlapped: Sequence[Sequence[tuple[int, int]]] | None = None) -> None:
        super().__init__(ranks)
        if placement not in PLACEMENTS:
            raise ValueError(f"placement must be one of {PLACEMENTS}, got {placement!r}")
        self.placement = placement
        self.overlapped = [list(u) for u in overlapped] if overlapped else [[] for _ in self]


def _check_placement(placement: str) -> None:
    if placement not in PLACEMENTS:
        raise ValueError(f"placement must be one of {PLACEMENTS}, got {placement!r}")


def placed_stage(rank: int, chunk: int, p: int, placement: str = "looped") -> int:
    """The stage of `rank`'s `chunk` (what `stage_of` returns; used by parlab's own code)."""
    if placement == "v":
        return rank if chunk == 0 else 2 * p - 1 - rank
    return chunk * p + rank


def placed_rank(stage: int, p: int, placement: str = "looped") -> tuple[int, int]:
    """(rank, chunk) holding `stage` (what `rank_and_chunk` returns)."""
    if placement == "v":
        return (stage, 0) if stage < p else (2 * p - 1 - stage, 1)
    return stage % p, stage // p


def stage_of(rank: int, chunk: int, p: int, *, placement: str = "looped") -> int:
    """The stage of rank r's chunk c: c p + r (looped); r for chunk 0 and 2p - 1 - r for
    chunk 1 (placement="v", DualPipe-V)."""
    _check_placement(placement)
    if placement == "v" and chunk not in (0, 1):
        raise ValueError(f"the V placement has two chunks per rank (0 and 1), got {chunk}")
    return placed_stage(rank, chunk, p, placement)


def rank_and_chunk(stage: int, p: int, *, placement: str = "looped") -> tuple[int, int]:
    """The inverse of stage_of: stage s lives on rank s % p as its chunk s // p (looped); on
    rank s as chunk 0 for s < p, else on rank 2p - 1 - s as chunk 1 (placement="v")."""
    _check_placement(placement)
    return placed_rank(stage, p, placement)


def placement_of(schedule: Any) -> str:
    """The schedule's placement: its `placement` attribute, "looped" for a plain list."""
    return getattr(schedule, "placement", "looped")


def overlapped_units(schedule: Any) -> list[list[tuple[int, int]]]:
    """Per rank, the (start, stop) ranges run as one overlapped F&B unit (none for a plain
    list)."""
    units = getattr(schedule, "overlapped", None)
    return [list(u) for u in units] if units else [[] for _ in schedule]


def label(a: Action) -> str:
    return f"{a.kind}{a.microbatch}" + (f" (chunk {a.chunk})" if a.chunk else "")
