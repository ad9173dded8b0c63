r"""When each action of a pipeline schedule may run, and whether the schedule can run at all.

For microbatch i, with stages placed by `parlab.pp.schedules.stage_of`:

    F(i, s)  needs  F(i, s-1)                     (the activation from the previous stage)
    B(i, s)  needs  F(i, s) and B(i, s+1)         (own activations; the gradient from above;
                                                   the last stage starts from its own loss)
    W(i, s)  needs  B(i, s)                       (same rank: W computes dL/dweights)

`validate(schedule)` raises `ScheduleError` naming the first broken dependency, or, when every
rank waits on another, the cycle of waits. `run_in_order` starts every action as soon as its
rank is free and its inputs exist; the simulator times it, `validate` runs it with unit costs
to find deadlocks.
"""

from __future__ import annotations

from collections.abc import Callable

from parlab.pp.schedules import Action, Schedule, ScheduleError, label, rank_and_chunk, shape_of

__all__ = ["dependencies", "validate", "run_in_order"]


def dependencies(action: Action, rank: int, p: int, v: int) -> list[tuple[int, Action]]:
    """(rank, action) pairs that must finish before `action` can start on `rank`."""
    i, c = action.microbatch, action.chunk
    s = c * p + rank  # this action's stage
    if action.kind == "W":
        return [(rank, Action("B", i, c))]
    if action.kind == "F":
        if s == 0:
            return []
        r, cc = rank_and_chunk(s - 1, p)
        return [(r, Action("F", i, cc))]
    deps = [(rank, Action("F", i, c))]
    if s < p * v - 1:
        r, cc = rank_and_chunk(s + 1, p)
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


def validate(schedule: Schedule) -> None:
    """Raise ScheduleError unless the schedule can run: every action once, each B after its F
    and each W after its B on the same rank, and no deadlock between ranks."""
    if not isinstance(schedule, (list, tuple)) or not schedule or not all(
            isinstance(order, (list, tuple)) for order in schedule):
        raise ScheduleError("a schedule is a list with one list of Actions per rank, got "
                            f"{type(schedule).__name__}")
    p, m, v, split = shape_of(schedule)
    if m == 0:
        raise ScheduleError("the schedule has no actions")
    _check_contents(schedule, p, m, v, split)
    run_in_order(schedule, lambda r, a: 1.0)  # unit costs: only a deadlock can stop it


def run_in_order(schedule: Schedule, duration: Callable[[int, Action], float], *,
                 latency: float = 0.0) -> list[list[tuple[Action, float, float]]]:
    """Start every action as soon as its rank is free and its dependencies are done
    (+ latency when they ran on another rank); each rank keeps its list order.

    Returns (action, start, end) per rank; raises ScheduleError on a deadlock."""
    p, _, v, _ = shape_of(schedule)
    done: dict[tuple[int, Action], float] = {}
    spans: list[list[tuple[Action, float, float]]] = [[] for _ in range(p)]
    free = [0.0] * p
    pos = [0] * p
    progress = True
    while progress:
        progress = False
        for r in range(p):
            while pos[r] < len(schedule[r]):
                a = schedule[r][pos[r]]
                deps = dependencies(a, r, p, v)
                if any(d not in done for d in deps):
                    break
                start = max([free[r]] + [done[(q, d)] + (latency if q != r else 0.0)
                                         for q, d in deps])
                end = start + duration(r, a)
                done[(r, a)] = free[r] = end
                spans[r].append((a, start, end))
                pos[r] += 1
                progress = True
    if any(pos[r] < len(schedule[r]) for r in range(p)):
        raise ScheduleError(_deadlock(schedule, pos, done, p, v))
    return spans


def _deadlock(schedule: Schedule, pos: list[int], done: dict, p: int, v: int) -> str:
    waits = {}
    for r in range(p):
        if pos[r] < len(schedule[r]):
            a = schedule[r][pos[r]]
            q, d = next((q, d) for q, d in dependencies(a, r, p, v) if (q, d) not in done)
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
