r"""Exercise 1 of module 04, `check_1f1b(one_f_one_b)`: the 1F1B order as data.

For several (p, m), m < p and numbers that are not powers of two included, the learner's
schedule must pass `parlab.pp.validate`, run min(p - r, m) forwards before rank r's first
backward, simulate (t_f = 1, t_b = 2, no latency) to the bubble $\frac{p-1}{m+p-1}$ (exact up
to 1e-12: the simulator adds whole numbers) with at most min(p - r, m) microbatches held on
rank r, and equal `parlab.pp.make_schedule("1f1b", p, m)` action for action. While it runs,
parlab's own `one_f_one_b` raises CheckFailed.

A right answer must not depend on p or m: the visible cases run p = 1 to 8 and m below, equal
to and above p (m < p leaves ranks with a shorter warm-up), neither a power of two nor a
multiple of the other; the hidden ones add p = 5 to 7, m = 1 and m = 3p. Rank r's warm-up
depends on r, and every rank's list is compared.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from parlab.check._compare import fail
from parlab.check._harness import call_learner, exercise, not_reexport
from parlab.pp import schedules as pp
from parlab.pp.order import validate
from parlab.pp.simulator import SimResult, simulate

__all__ = ["check_1f1b", "SCHEDULE_CASES", "schedule_shape"]

SCHEDULE_CASES: list[tuple[int, int]] = [(2, 4), (4, 8), (4, 4), (3, 5), (4, 2), (1, 3), (8, 16),
                                         (3, 7)]
WARMUP = ("1F1B's warm-up on rank r is p - r - 1 forwards: the activation of microbatch 0 "
          "needs p - r - 1 more stages to reach the last one, which starts its backward; one "
          "forward more holds one microbatch more, one fewer leaves the rank idle")
STEADY = ("in the steady phase each step runs the forward of a new microbatch, then the "
          "backward of the oldest one still held (microbatch i after warm-up + i forwards)")


def _first_difference(got: pp.Schedule, want: pp.Schedule) -> str:
    for r, (g, w) in enumerate(zip(got, want, strict=True)):
        for i, (a, b) in enumerate(zip(g, w, strict=False)):
            if a != b:
                return f"rank {r}, position {i}: expected {b}, got {a}"
        if len(g) != len(w):
            return f"rank {r} has {len(g)} actions, expected {len(w)}"
    return ""


def schedule_shape(sched: Any, p: int, m: int, *, name: str = "one_f_one_b") -> None:
    """Fail, saying what was expected, unless `sched` is p lists of Actions."""
    if not isinstance(sched, (list, tuple)) or len(sched) != p:
        got = f"{len(sched)} lists" if isinstance(sched, (list, tuple)) else \
            type(sched).__name__
        fail(f"{name}({p}, {m}) returned {got}, expected a list of p = {p} lists "
             "(one per rank)", hint="return [actions of rank 0, actions of rank 1, ...]")
    for r, order in enumerate(sched):
        bad = [a for a in order if not isinstance(a, pp.Action)] \
            if isinstance(order, (list, tuple)) else [order]
        if bad:
            fail(f"{name}({p}, {m}): rank {r}'s entry holds {bad[0]!r}, not a list of Actions",
                 hint='build actions as Action("F", i) and Action("B", i), one list per rank')


def _one_case(fn: Callable[[int, int], pp.Schedule], p: int, m: int) -> SimResult:
    where = f"one_f_one_b(p={p}, m={m})"
    sched = call_learner(f"one_f_one_b({p}, {m})", fn, p, m, refuse=[pp.one_f_one_b],
                         refusal="parlab.pp.one_f_one_b")
    schedule_shape(sched, p, m)
    try:
        validate(sched)
    except pp.ScheduleError as err:
        fail(f"{where} cannot run: {err}", hint=STEADY if "before" in str(err) else
             "every rank needs F and B of every microbatch, in an order whose waits on "
             "other ranks never form a cycle")
    for r, order in enumerate(sched):
        before = next((i for i, a in enumerate(order) if a.kind == "B"), len(order))
        want = min(p - r, m)  # p - r - 1 of warm-up, then the first steady step's F
        if before != want:
            fail(f"{where}: rank {r} runs {before} forwards before its first backward, "
                 f"expected {want}: a warm-up of p - r - 1 = {p - r - 1}, then the first "
                 "steady step's forward" + (f" (only m = {m} exist)" if m < p - r else ""),
                 hint="warm-up count off by one? " + WARMUP)
    sim = simulate(sched, t_f=1.0, t_b=2.0)
    for r, peak in enumerate(sim.peak_activations):
        if peak > min(p - r, m):
            fail(f"{where}: rank {r} holds {peak:g} microbatches at once, 1F1B holds at "
                 f"most min(p - r, m) = {min(p - r, m)}", hint=STEADY)
    bubble = (p - 1) / (m + p - 1)
    if abs(sim.bubble_fraction - bubble) > 1e-12:
        fail(f"{where}: simulated bubble {sim.bubble_fraction:.4f} (t_f = 1, t_b = 2), "
             f"expected (p - 1)/(m + p - 1) = {bubble:.4f}", hint=STEADY)
    diff = _first_difference(sched, pp.make_schedule("1f1b", p, m))
    if diff:
        fail(f"{where} runs, and its bubble and memory are 1F1B's, but its order differs "
             f"from parlab.pp.make_schedule('1f1b', {p}, {m}): {diff}",
             hint="take backwards oldest first and forwards in order, F before B in "
                  "each steady step")
    return sim


@exercise("04.1f1b")
def check_1f1b(fn: Callable[[int, int], pp.Schedule], *, quiet: bool = False,
               cases: Sequence[tuple[int, int]] = SCHEDULE_CASES) -> None:
    """Exercise 1: validate, warm-up counts, simulated bubble and memory, then make_schedule."""
    not_reexport(fn, name="one_f_one_b")
    sims = {(p, m): _one_case(fn, p, m) for p, m in cases}
    if not quiet:
        p, m = next(((p, m) for p, m in cases if p > 2), cases[0])
        sim = sims[(p, m)]
        print(f"1F1B OK on {len(cases)} (p, m) pairs. p = {p}, m = {m}: bubble "
              f"{sim.bubble_fraction:.4f} = (p - 1)/(m + p - 1) = {p - 1}/{m + p - 1}, peak "
              f"activations per rank {[int(x) for x in sim.peak_activations]}")
