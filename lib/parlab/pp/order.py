r"""When each action of a pipeline schedule may run, and whether the schedule can run at all.

For microbatch i, with stages placed by `parlab.pp.stage_of` (looped, or the V of DualPipe-V:
the schedule's `placement`, or `placement=` given here):

    F(i, s)  needs  F(i, s-1)                     (the activation from the previous stage)
    B(i, s)  needs  F(i, s) and B(i, s+1)         (own activations; the gradient from above;
                                                   the last stage starts from its own loss)
    W(i, s)  needs  B(i, s)                       (same rank: W computes dL/dweights)

`validate(schedule)` raises `ScheduleError` naming the first broken dependency, or, when every
rank waits on another, the cycle of waits. `run_in_order` starts every action as soon as its
rank is free and its inputs exist; the simulator times it, `validate` runs it with unit costs
to find deadlocks. With `fused=` it runs each of a schedule's overlapped units (DualPipe-V's
F&B pairs, `parlab.pp.overlapped_units`) as one: the unit starts when the rank is free and
the inputs of all its actions exist, and all of them end together.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from parlab.pp.actions import (
    Action,
    Schedule,
    ScheduleError,
    label,
    overlapped_units,
    placed_rank,
    placed_stage,
    placement_of,
)
from parlab.pp.schedules import shape_of

__all__ = ["dependencies", "validate", "run_in_order"]


def dependencies(action: Action, rank: int, p: int, v: int, *,
                 placement: str = "looped") -> list[tuple[int, Action]]:
    """(rank, action) pairs that must finish before `action` can start on `rank`."""
    i, c = action.microbatch, action.chunk
    s = placed_stage(rank, c, p, placement)  # this action's stage
    if action.kind == "W":
        return [(rank, Action("B", i, c))]
    if action.kind == "F":
        if s == 0:
            return []
        r, cc = placed_rank(s - 1, p, placement)
        return [(r, Action("F", i, cc))]
    deps = [(rank, Action("F", i, c))]
    if s < p * v - 1:
        r, cc = placed_rank(s + 1, p, placement)
        deps.append((r, Action("B", i, cc)))
    return deps


def _check_contents(schedule: Schedule, p: int, m: int, v: int, split: bool) -> None:
    kinds = ("F", "B", "W") if split else ("F", "B")
    for r, order in enumerate(schedule):
        seen: dict[Action, int] = {}
        for pos, a in enumerate(order):
            if not isinstance(a, Action):
                raise ScheduleError(f"rank {r}, position {pos}: {a!r} is not an Action")
            if a in seen:
                raise ScheduleError(f"rank {r} runs {label(a)} twice (positions {seen[a]} "
                                    f"and {pos}): every action runs exactly once")
            seen[a] = pos
        for c in range(v):
            for i in range(m):
                for k in kinds:
                    if Action(k, i, c) not in seen:
                        raise ScheduleError(
                            f"rank {r} never runs {label(Action(k, i, c))}: with m = {m} and "
                            f"v = {v} every rank runs F, B{', W' if split else ''} of every "
                            "microbatch on every chunk")
        for a, pos in seen.items():  # a backward needs its forward's activations, W its B
            if a.kind != "F":
                before = Action("F" if a.kind == "B" else "B", a.microbatch, a.chunk)
                if seen[before] > pos:
                    why = ("a backward needs the activations its forward stored" if a.kind ==
                           "B" else "W needs the output gradient that B receives")
                    raise ScheduleError(f"rank {r} runs {label(a)} (position {pos}) before "
                                        f"{label(before)} (position {seen[before]}): {why}")


def _stages(schedule: Schedule, placement: str | None) -> tuple[str, int]:
    """(placement, chunks per rank) to check `schedule` under."""
    placement = placement or placement_of(schedule)
    if placement not in ("looped", "v"):
        raise ValueError(f"placement must be 'looped' or 'v', got {placement!r}")
    v = shape_of(schedule)[2]
    if placement == "v" and v > 2:
        raise ScheduleError(f"the V placement gives each rank two chunks (0 and 1), but the "
                            f"schedule uses chunk {v - 1}")
    return placement, 2 if placement == "v" else v


V_HINT = (" (checked under looped placement, stage c p + r: a DualPipe-V order needs its V, "
          "validate(schedule, placement='v'), or the schedule make_schedule returned, which "
          "carries it)")


def validate(schedule: Schedule, *, placement: str | None = None) -> None:
    """Raise ScheduleError unless the schedule can run: every action once, each B after its F
    and each W after its B on the same rank, and no deadlock between ranks. `placement`
    ("looped" or "v") defaults to the schedule's own (`parlab.pp.placement_of`)."""
    if not isinstance(schedule, (list, tuple)) or not schedule or not all(
            isinstance(order, (list, tuple)) for order in schedule):
        raise ScheduleError("a schedule is a list with one list of Actions per rank, got "
                            f"{type(schedule).__name__}")
    p, m, _, split = shape_of(schedule)
    if m == 0:
        raise ScheduleError("the schedule has no actions")
    placement, v = _stages(schedule, placement)
    _check_contents(schedule, p, m, v, split)
    try:
        run_in_order(schedule, lambda r, a: 1.0, placement=placement)  # only a deadlock stops it
    except ScheduleError as err:
        if placement == "looped" and v == 2 and split:
            raise ScheduleError(str(err) + V_HINT) from None
        raise


def _units(schedule: Schedule, fused: bool) -> list[list[list[Action]]]:
    """Each rank's list cut into units: one action each, or an overlapped range as one."""
    ranges = overlapped_units(schedule) if fused else [[] for _ in schedule]
    out = []
    for order, spans in zip(schedule, ranges, strict=True):
        starts, units, i = dict(spans), [], 0
        while i < len(order):
            stop = starts.get(i, i + 1)
            units.append(list(order[i:stop]))
            i = stop
        out.append(units)
    return out


def run_in_order(schedule: Schedule, duration: Callable[[int, Action], float], *,
                 latency: float = 0.0, placement: str | None = None,
                 fused: Callable[[int, Sequence[Action]], float] | None = None
                 ) -> list[list[tuple[Action, float, float]]]:
    """Start every action as soon as its rank is free and its dependencies are done
    (+ latency when they ran on another rank); each rank keeps its list order. With `fused`,
    each overlapped unit of the schedule runs as one, lasting fused(rank, its actions).

    Returns (action, start, end) per rank; raises ScheduleError on a deadlock."""
    p, _, v, _ = shape_of(schedule)
    placement, v = _stages(schedule, placement)
    units = _units(schedule, fused is not None)
    done: dict[tuple[int, Action], float] = {}
    spans: list[list[tuple[Action, float, float]]] = [[] for _ in range(p)]
    free, pos = [0.0] * p, [0] * p
    progress = True
    while progress:
        progress = False
        for r in range(p):
            while pos[r] < len(units[r]):
                unit = units[r][pos[r]]
                deps = [d for a in unit for d in dependencies(a, r, p, v, placement=placement)
                        if not (d[0] == r and d[1] in unit)]
                if any(d not in done for d in deps):
                    break
                start = max([free[r]] + [done[(q, d)] + (latency if q != r else 0.0)
                                         for q, d in deps])
                end = start + (duration(r, unit[0]) if len(unit) == 1 or fused is None
                               else fused(r, unit))
                for a in unit:
                    done[(r, a)] = end
                    spans[r].append((a, start, end))
                free[r] = end
                pos[r] += 1
                progress = True
    if any(pos[r] < len(units[r]) for r in range(p)):
        raise ScheduleError(_deadlock(units, pos, done, p, v, placement))
    return spans


def _deadlock(units: list[list[list[Action]]], pos: list[int], done: dict, p: int, v: int,
              placement: str) -> str:
    waits = {}
    for r in range(p):
        if pos[r] < len(units[r]):
            unit = units[r][pos[r]]
            a, q, d = next((a, q, d) for a in unit
                           for q, d in dependencies(a, r, p, v, placement=placement)
                           if (q, d) not in done and not (q == r and d in unit))
            waits[r] = (a, q, d)
    lines = [f"rank {r} waits at {label(a)} for rank {q}'s {label(d)}"
             for r, (a, q, d) in waits.items()]
    cycle, r = [], next(iter(waits))
    while r not in cycle and r in waits:
        cycle.append(r)
        r = waits[r][1]
    loop = " -> ".join(str(x) for x in cycle[cycle.index(r):] + [r]) if r in cycle else ""
    return ("deadlock: " + "; ".join(lines) + (f" (a cycle: ranks {loop})" if loop else "")
            + ". Each rank runs its list in order, so an action that waits on another rank "
            "blocks everything after it")
