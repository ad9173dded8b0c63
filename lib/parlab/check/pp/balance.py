r"""Exercise 5 of module 04, `check_balance(balance)`: layers per stage for unequal layers.

Per-layer costs whose first entry is the embedding and last the LM head; the slowest stage of
the learner's split must be as fast as the best split's (within 1e-9 relative), computed by
`parlab.pp.balance_stages` (dynamic programming; refused while the learner's code runs). Any
split reaching it is accepted. The list of costs must be left as it was: the notebook uses it
again after the call.

A right answer must not depend on the number of layers (3 to 24), on p (2 to 6, p = n
included), on where the expensive layers are (at the ends, in the middle, scattered), or on
the costs being whole numbers or all equal; greedy splits (fill each stage up to the mean,
or just past it) and an equal split fail the visible cases, as they fail the hidden ones.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from parlab.check._compare import expect_type, fail
from parlab.check._harness import call_learner, exercise, not_reexport
from parlab.pp.simulator import balance_stages, stage_times

__all__ = ["check_balance", "BALANCE_CASES"]

BALANCE_CASES: list[tuple[list[float], int]] = [
    ([0.2] + [1.0] * 14 + [2.6], 4),
    ([0.2] + [1.0] * 22 + [2.6], 6),
    ([3.0] + [1.0] * 6 + [3.0], 4),
    ([0.5, 1.0, 1.0, 1.0, 1.0, 4.0], 2),
    ([1.0] * 8, 4),
    ([0.2, 1.0, 2.5, 0.7, 1.1, 1.9, 0.4, 1.6, 3.0], 3),
    ([2.0, 1.0, 1.0], 3),
    ([0.2] + [1.0] * 11 + [2.6], 5),
]
EQUAL = ("an equal split ignores that the first stage also runs the embedding and the last "
         "the LM head (and the loss): give them fewer layers")
SEARCH = ("the slowest stage sets the pipeline's pace: try every number of layers for the "
          "first stage and split the rest the same way, or search the smallest limit that p "
          "stages can stay under")


def _describe(costs: Sequence[float], counts: Sequence[int]) -> str:
    times, start, parts = stage_times(costs, counts), 0, []
    for k, (n, t) in enumerate(zip(counts, times, strict=True)):
        parts.append(f"stage {k}: layers {start}..{start + n - 1} = {t:g}")
        start += n
    return "; ".join(parts)


def _one_case(fn: Callable[[list[float], int], Sequence[int]], costs: list[float],
              p: int) -> list[int]:
    n = len(costs)
    where = f"balance({n} layer costs {costs[:2]}...{costs[-1:]}, p={p})"
    given = list(costs)
    counts = call_learner(f"balance(costs, {p})", fn, given, p, refuse=[balance_stages],
                          refusal="parlab.pp.balance_stages")
    if given != costs:
        fail(f"{where} changed the list of costs it was given (now {given[:3]}...): the caller "
             "still needs it (the notebook draws the stages with it afterwards)",
             hint="work on a copy (list(layer_costs)) or build new lists (prefix sums in a "
                  "list of their own) instead of writing into layer_costs")
    expect_type(counts, (list, tuple), name=where, what=f"a list of {p} ints (layers per "
                "stage)")
    if len(counts) != p or not all(isinstance(k, int) and not isinstance(k, bool)
                                   for k in counts):
        fail(f"{where} returned {list(counts)!r}, expected a list of {p} ints (layers per "
             "stage)", hint="return how many consecutive layers each stage takes")
    if min(counts) < 1 or sum(counts) != n:
        fail(f"{where} returned {list(counts)}: every stage needs at least one layer and "
             f"the counts must add up to the {n} layers (sum {sum(counts)})",
             hint="count layers, not costs: stage k takes counts[k] consecutive entries")
    got = max(stage_times(costs, counts))
    best_counts = balance_stages(costs, p)
    best = max(stage_times(costs, best_counts))
    if got > best * (1 + 1e-9):
        equal = max(counts) - min(counts) <= 1  # (nearly) the same layers everywhere
        fail(f"{where}: your slowest stage costs {got:g} ({_describe(costs, counts)}); "
             f"the best split's slowest costs {best:g}, e.g. {best_counts} "
             f"({_describe(costs, best_counts)})", hint=EQUAL if equal else SEARCH)
    return list(counts)


@exercise("04.balance")
def check_balance(fn: Callable[[list[float], int], Sequence[int]], *, quiet: bool = False,
                  cases: Sequence[tuple[list[float], int]] = BALANCE_CASES) -> None:
    """Exercise 5: layers per stage whose slowest stage is the best possible."""
    not_reexport(fn, name="balance")
    splits = [_one_case(fn, list(costs), p) for costs, p in cases]
    if not quiet:
        (costs, p), counts = cases[0], splits[0]
        print(f"balance OK on {len(cases)} cases. {len(costs)} layers (embedding "
              f"{costs[0]}, LM head {costs[-1]}) on p = {p}: {counts}, slowest stage "
              f"{max(stage_times(costs, counts)):g}")
