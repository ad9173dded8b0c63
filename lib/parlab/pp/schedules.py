r"""Pipeline schedules as data: which action each rank runs, in which order.

A pipeline splits a model's layers into $p \cdot v$ stages on $p$ ranks and the batch into $m$
microbatches. A *schedule* is one list of actions per rank, run in list order:

    Action("F", 3)            forward of microbatch 3 through this rank's (only) chunk
    Action("B", 3, chunk=1)   backward of microbatch 3 through this rank's chunk 1
    Action("W", 3)            the weight-gradient half of a split backward (zero bubble)

Placement is looped: rank r's chunk c is stage $s = c\,p + r$, so a microbatch visits ranks
0, 1, ..., p-1, 0, 1, ... and every stage boundary is a point-to-point message between
neighbouring ranks (p-1 -> 0 between chunks). DualPipe-V alone uses the V placement (chunk 0
is stage r, chunk 1 stage 2p-1-r; `parlab.pp.actions`, `parlab.pp.dualpipe`) and returns a
`PlacedSchedule` that says so. Dependencies, for microbatch i and stage s:

    F(i, s)  needs  F(i, s-1)                     (the activation from the previous stage)
    B(i, s)  needs  F(i, s) and B(i, s+1)         (own activations; the gradient from above;
                                                   the last stage starts from its own loss)
    W(i, s)  needs  B(i, s)                       (same rank: W computes dL/dweights)

`make_schedule(name, p, m, v=1)` builds "gpipe", "1f1b", "interleaved_1f1b", "zb_h1" (each a
short function below with its Warmup / Steady / Cooldown phases marked) and "dualpipe_v"
(`parlab.pp.dualpipe`, its eight phases).
The dependencies and `validate` live in `parlab.pp.order`, timing in `parlab.pp.simulator`,
pictures in `parlab.pp.plot`, execution on real ranks in `parlab.pp.executor`.
"""

from __future__ import annotations

from collections.abc import Callable

from parlab.pp.actions import (
    Action,
    PlacedSchedule,
    Schedule,
    ScheduleError,
    label,
    overlapped_units,
    placement_of,
    rank_and_chunk,
    stage_of,
)
from parlab.pp.dualpipe import dualpipe_v

__all__ = ["Action", "Schedule", "PlacedSchedule", "ScheduleError", "SCHEDULES",
           "make_schedule", "gpipe", "one_f_one_b", "interleaved_1f1b", "zb_h1", "dualpipe_v",
           "stage_of", "rank_and_chunk", "placement_of", "overlapped_units", "format_schedule",
           "shape_of", "label"]


# --- the schedules ----------------------------------------------------------------------------

def gpipe(p: int, m: int) -> Schedule:
    """GPipe: every forward, then every backward. Each rank holds all m microbatches."""
    schedule = []
    for _rank in range(p):
        order = [Action("F", i) for i in range(m)]  # Warmup (fill): all m forwards
        order += [Action("B", i) for i in range(m)]  # Cooldown (drain): all m backwards
        schedule.append(order)
    return schedule


def one_f_one_b(p: int, m: int) -> Schedule:
    """1F1B (PipeDream-flush): p-r-1 forwards, then one forward one backward, then drain.

    Rank r holds at most min(p - r, m) microbatches; the bubble is GPipe's."""
    schedule = []
    for r in range(p):
        warmup = min(p - r - 1, m)
        order = [Action("F", i) for i in range(warmup)]  # Warmup
        for i in range(m - warmup):  # Steady: F of a new microbatch, B of the oldest
            order += [Action("F", warmup + i), Action("B", i)]
        order += [Action("B", i) for i in range(m - warmup, m)]  # Cooldown
        schedule.append(order)
    return schedule


def _virtual(k: int, p: int, v: int, *, backward: bool) -> tuple[int, int]:
    """The k-th forward (or backward) of a rank under interleaving: (chunk, microbatch).

    Microbatches go in groups of p: the group's p forwards on chunk 0, then on chunk 1, ...,
    then the next group. Backwards visit the chunks in reverse."""
    group, within = divmod(k, p * v)
    chunk = within // p
    return (v - 1 - chunk if backward else chunk), group * p + within % p


def interleaved_1f1b(p: int, m: int, v: int) -> Schedule:
    """Megatron's interleaved 1F1B: v chunks per rank; needs m to be a multiple of p.

    Warm-up on rank r: 2(p-r-1) + (v-1)p chunk-forwards (every chunk of the first group
    before the first backward returns). Bubble (p-1)/(vm + p-1): fill and drain cost 1/v."""
    if v == 1:
        return one_f_one_b(p, m)
    if m % p:
        raise ValueError(f"interleaved 1F1B needs m to be a multiple of p (Megatron): "
                         f"m = {m}, p = {p}; try m = {(m // p + 1) * p}")
    total = m * v
    schedule = []
    for r in range(p):
        warmup = min(2 * (p - r - 1) + (v - 1) * p, total)
        fwd = [Action("F", mb, c) for c, mb in
               (_virtual(k, p, v, backward=False) for k in range(total))]
        bwd = [Action("B", mb, c) for c, mb in
               (_virtual(k, p, v, backward=True) for k in range(total))]
        order = fwd[:warmup]  # Warmup
        for i in range(total - warmup):  # Steady
            order += [fwd[warmup + i], bwd[i]]
        order += bwd[total - warmup:]  # Cooldown
        schedule.append(order)
    return schedule


def zb_h1(p: int, m: int) -> Schedule:
    """ZB-H1 (Qi et al., 2024): the backward split into B (dL/dinput) and W (dL/dweights).

    B stays on the critical path; W has no consumer on another rank, so rank r runs each W
    r steps late and leaves its last r W's for the drain, where 1F1B idles. Rank r holds at most p
    microbatches (1F1B's peak on rank 0). With t_f = t_b = t_w the idle time per rank is
    (p-1) t against 1F1B's (p-1)(t_f + t_b + t_w) = 3(p-1) t: a third."""
    schedule = []
    for r in range(p):
        warmup = min(p - r - 1, m)
        order = [Action("F", i) for i in range(warmup)]  # Warmup: as 1F1B
        w = 0  # next W to run
        for i in range(m - warmup):  # Steady: F, B, and a W once r of them are waiting
            order += [Action("F", warmup + i), Action("B", i)]
            if i >= r:
                order.append(Action("W", w))
                w += 1
        for i in range(m - warmup, m):  # Cooldown: drain B's, a W after each
            order.append(Action("B", i))
            order.append(Action("W", w))
            w += 1
        order += [Action("W", i) for i in range(w, m)]  # the postponed W's fill the drain
        schedule.append(order)
    return schedule


SCHEDULES: dict[str, Callable[..., Schedule]] = {
    "gpipe": gpipe, "1f1b": one_f_one_b, "interleaved_1f1b": interleaved_1f1b, "zb_h1": zb_h1,
    "dualpipe_v": dualpipe_v,
}


def make_schedule(name: str, p: int, m: int, v: int = 1) -> Schedule:
    """One list of actions per rank for schedule `name` with p ranks, m microbatches, v chunks."""
    for what, value in (("p", p), ("m", m), ("v", v)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"{what} must be an int >= 1, got {value!r}")
    if name not in SCHEDULES:
        raise ValueError(f"unknown schedule {name!r}; choose one of {sorted(SCHEDULES)}")
    if name == "interleaved_1f1b":
        return interleaved_1f1b(p, m, v)
    if name == "dualpipe_v":
        if v not in (1, 2):
            raise ValueError(f"dualpipe_v has two chunks per rank in a V; v = {v} is not "
                             "an option (leave it out, or pass v=2)")
        return dualpipe_v(p, m)
    if v != 1:
        raise ValueError(f"{name} has one chunk per rank (v = 1); v = {v} needs "
                         "'interleaved_1f1b'")
    return SCHEDULES[name](p, m)


# --- checking a schedule -----------------------------------------------------------------------

def shape_of(schedule: Schedule) -> tuple[int, int, int, bool]:
    """(p, m, v, split): ranks, microbatches, chunks per rank, whether W actions are used."""
    actions = [a for order in schedule for a in order]
    if not actions:
        return len(schedule), 0, 1, False
    m = 1 + max(a.microbatch for a in actions)
    v = 1 + max(a.chunk for a in actions)
    return len(schedule), m, v, any(a.kind == "W" for a in actions)


def format_schedule(schedule: Schedule) -> str:
    """One line per rank: `rank 0: F0 F1 B0 ...`."""
    return "\n".join(f"rank {r}: " + " ".join(str(a) for a in order)
                     for r, order in enumerate(schedule))
