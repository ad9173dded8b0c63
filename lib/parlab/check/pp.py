r"""Graded checks of module 04, "Pipeline parallelism" (exercises 1 and 4 here; 2 and 3, also
importable from here, in `parlab.check.pp_ranks`, which run on several ranks).

Exercise 1, `check_1f1b(one_f_one_b)`: for several (p, m), including m < p, the learner's
schedule must pass `parlab.pp.validate`, run p - r - 1 forwards before rank r's first
backward, simulate (t_f = 1, t_b = 2, no latency) to the bubble $\frac{p-1}{m+p-1}$ (exact up
to 1e-12: the simulator adds whole numbers) with at most min(p - r, m) microbatches held on
rank r, and equal `parlab.pp.make_schedule("1f1b", p, m)` action for action.

Exercise 4, `check_balance(balance)`: layers per stage for per-layer costs whose first
entry is the embedding and last the LM head. The slowest stage must be as fast as the best
split's (within 1e-9 relative); any split reaching it is accepted.

While a learner's function runs, parlab's own answers (parlab.pp's 1F1B, stage_of,
balance_stages) raise CheckFailed, so an answer that calls them is rejected.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from parlab.check import CheckFailed, fail, not_reexport
from parlab.errors import reference_message, refused
from parlab.pp import schedules as pp
from parlab.pp.order import validate
from parlab.pp.simulator import balance_stages, simulate, stage_times

__all__ = ["check_1f1b", "check_balance", "CheckFailed", "call", "BALANCE_CASES"]
# check_p2p_step and check_placement come from parlab.check.pp_ranks (module __getattr__ at the
# bottom), so test cells import every check from here.

SCHEDULE_CASES: list[tuple[int, int]] = [(2, 4), (4, 8), (4, 4), (3, 5), (4, 2), (1, 3), (8, 16)]
WARMUP = ("1F1B's warm-up on rank r is p - r - 1 forwards: the activation of microbatch 0 "
          "needs p - r - 1 more stages to reach the last one, which starts its backward; one "
          "forward more holds one microbatch more, one fewer leaves the rank idle")
STEADY = ("in the steady phase each step runs the forward of a new microbatch, then the "
          "backward of the oldest one still held (microbatch i after warm-up + i forwards)")


def call(what: str, fn: Callable[..., Any], *args: Any, refuse: tuple[Callable, ...] = (),
         rank: int | None = None) -> Any:
    """Run learner code with parlab's answers refused; a crash becomes CheckFailed."""
    try:
        names = " / ".join(f"parlab.pp.{f.__name__}" for f in refuse)
        with refused(refuse, reference_message(names)):
            return fn(*args)
    except (NotImplementedError, CheckFailed):
        raise
    except Exception as exc:  # noqa: BLE001 - reported to the learner
        fail(f"{what} raised {type(exc).__name__}: {exc}", rank=rank,
             hint="read the error above; try the function by hand on a small case")


def _first_difference(got: pp.Schedule, want: pp.Schedule) -> str:
    for r, (g, w) in enumerate(zip(got, want, strict=True)):
        for i, (a, b) in enumerate(zip(g, w, strict=False)):
            if a != b:
                return f"rank {r}, position {i}: expected {b}, got {a}"
        if len(g) != len(w):
            return f"rank {r} has {len(g)} actions, expected {len(w)}"
    return ""


def _shape(sched: Any, p: int, m: int) -> None:
    if not isinstance(sched, (list, tuple)) or len(sched) != p:
        got = len(sched) if isinstance(sched, (list, tuple)) else type(sched).__name__
        fail(f"one_f_one_b({p}, {m}) returned {got}, expected a list of p = {p} lists "
             "(one per rank)", hint="return [actions of rank 0, actions of rank 1, ...]")
    for r, order in enumerate(sched):
        bad = [a for a in order if not isinstance(a, pp.Action)] \
            if isinstance(order, (list, tuple)) else [order]
        if bad:
            fail(f"one_f_one_b({p}, {m}): rank {r}'s list holds {bad[0]!r}, not an Action",
                 hint='build actions as Action("F", i) and Action("B", i)')


def check_1f1b(fn: Callable[[int, int], pp.Schedule], *, quiet: bool = False,
               cases: Sequence[tuple[int, int]] = SCHEDULE_CASES) -> None:
    """Exercise 1: validate, warm-up counts, simulated bubble and memory, then make_schedule."""
    not_reexport(fn, name="one_f_one_b")
    for p, m in cases:
        sched = call(f"one_f_one_b({p}, {m})", fn, p, m, refuse=(pp.one_f_one_b,))
        _shape(sched, p, m)
        where = f"one_f_one_b(p={p}, m={m})"
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
    if not quiet:
        p, m = 4, 8
        sim = simulate(fn(p, m))
        print(f"1F1B OK on {len(cases)} (p, m) pairs. p = {p}, m = {m}: bubble "
              f"{sim.bubble_fraction:.4f} = 3/11, peak activations per rank "
              f"{[int(x) for x in sim.peak_activations]}")


# --- exercise 4: balancing stages ------------------------------------------------------------

BALANCE_CASES: list[tuple[list[float], int]] = [
    ([0.2] + [1.0] * 14 + [2.6], 4),
    ([0.2] + [1.0] * 22 + [2.6], 6),
    ([3.0] + [1.0] * 6 + [3.0], 4),
    ([0.5, 1.0, 1.0, 1.0, 1.0, 4.0], 2),
    ([1.0] * 8, 4),
    ([0.2, 1.0, 2.5, 0.7, 1.1, 1.9, 0.4, 1.6, 3.0], 3),
    ([2.0, 1.0, 1.0], 3),
]
EQUAL = ("an equal split ignores that the first stage also runs the embedding and the last "
         "the LM head (and the loss): give them fewer layers")


def _describe(costs: Sequence[float], counts: Sequence[int]) -> str:
    times, start, parts = stage_times(costs, counts), 0, []
    for k, (n, t) in enumerate(zip(counts, times, strict=True)):
        parts.append(f"stage {k}: layers {start}..{start + n - 1} = {t:g}")
        start += n
    return "; ".join(parts)


def check_balance(fn: Callable[[Sequence[float], int], Sequence[int]], *, quiet: bool = False,
                  cases: Sequence[tuple[list[float], int]] = BALANCE_CASES) -> None:
    """Exercise 4: layers per stage whose slowest stage is the best possible."""
    not_reexport(fn, name="balance")
    for costs, p in cases:
        n = len(costs)
        counts = call(f"balance(costs, {p})", fn, list(costs), p, refuse=(balance_stages,))
        where = f"balance({n} layer costs {costs[:2]}...{costs[-1:]}, p={p})"
        if not isinstance(counts, (list, tuple)) or len(counts) != p or not all(
                isinstance(k, int) and not isinstance(k, bool) for k in counts):
            fail(f"{where} returned {counts!r}, expected a list of {p} ints (layers per "
                 "stage)", hint="return how many consecutive layers each stage takes")
        if min(counts) < 1 or sum(counts) != n:
            fail(f"{where} returned {list(counts)}: every stage needs at least one layer and "
                 f"the counts must add up to the {n} layers (sum {sum(counts)})")
        got = max(stage_times(costs, counts))
        best_counts = balance_stages(costs, p)
        best = max(stage_times(costs, best_counts))
        if got > best * (1 + 1e-9):
            equal = max(counts) - min(counts) <= 1  # (nearly) the same layers everywhere
            fail(f"{where}: your slowest stage costs {got:g} ({_describe(costs, counts)}); "
                 f"the best split's slowest costs {best:g}, e.g. {best_counts} "
                 f"({_describe(costs, best_counts)})",
                 hint=EQUAL if equal else "the slowest stage sets the pipeline's pace: try "
                 "every number of layers for the first stage and split the rest the same way, "
                 "or search the smallest limit that p stages can stay under")
    if not quiet:
        costs, p = cases[0]
        counts = fn(list(costs), p)
        print(f"balance OK on {len(cases)} cases. {len(costs)} layers (embedding "
              f"{costs[0]}, LM head {costs[-1]}) on p = {p}: {list(counts)}, slowest stage "
              f"{max(stage_times(costs, counts)):g}")


def __getattr__(name: str) -> Any:
    if name in ("check_p2p_step", "check_placement"):
        from parlab.check import pp_ranks

        return getattr(pp_ranks, name)
    raise AttributeError(f"module 'parlab.check.pp' has no attribute {name!r}")
