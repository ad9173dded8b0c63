r"""Module 01, exercise 3: `check_reshard_plan(plan_reshard)`, keep or refetch per layer.

`plan_reshard(sizes, budget)` returns reshard_after_forward per layer. A plan is graded by the
memory of its kept layers (at most the budget) and the bytes it moves (the fewest possible,
found here by trying every subset): over d ranks a kept layer i moves $2\frac{d-1}{d}s_i$, a
resharded one $3\frac{d-1}{d}s_i$. The fixed cases include three where keeping the largest
layers first leaves budget unused; the hidden ones are random, with sizes that are not whole
numbers. `sizes` must come back unchanged; parlab.dp.fsdp's planner and
parlab.costs.dp_traffic_bytes are refused while the plan runs.

A right answer does not depend on, and the tests vary: the sizes and the budget (whole MB in
the fixed cases, not whole numbers in random ones: the visible test adds 10, the hidden 40, so
a plan that rounds the sizes to whole MB, as a knapsack table over megabytes does, fails
visibly and is named when it is the best plan of the rounded problem), the number of layers
(2 to 7), the ranks d (2 to 8), the order of the layers (the largest first or not).
"""

from __future__ import annotations

import itertools
import math
import random
from collections.abc import Callable
from typing import Any

from parlab.check._compare import fail
from parlab.check._harness import exercise
from parlab.check.fsdp.common import PLAN_WHAT, call, not_the_course, plan_references

__all__ = ["check_reshard_plan", "CASES"]

CASES = [  # (sizes in MB, budget in MB, d ranks); three defeat "keep the largest first"
    ([4, 4, 4, 4], 100, 4), ([4, 4, 4, 4], 0, 2), ([10, 2, 7, 3], 12, 8),
    ([6, 5, 5], 10, 4), ([8, 3, 3, 3, 3], 12, 2), ([9, 7, 6, 4, 2], 12, 8),
]


def _cost(sizes: list[float], reshard: list[bool], d: int) -> tuple[float, float]:
    peak = sum(s for s, r in zip(sizes, reshard, strict=True) if not r)
    moved = sum((3 if r else 2) * (d - 1) / d * s for s, r in zip(sizes, reshard, strict=True))
    return peak, moved


def _best_moved(sizes: list[float], budget: float, d: int) -> float:
    best = math.inf
    for plan in itertools.product((True, False), repeat=len(sizes)):
        peak, moved = _cost(sizes, list(plan), d)
        if peak <= budget:
            best = min(best, moved)
    return best


def _cases(random_cases: int, seed: int) -> list[tuple[list[float], float, int]]:
    rng = random.Random(seed)
    out = [([s * 1e6 for s in sizes], budget * 1e6, d) for sizes, budget, d in CASES]
    for _ in range(random_cases):
        sizes = [round(rng.uniform(0.5, 12.0), 3) * 1e6 for _ in range(rng.randint(2, 7))]
        out.append((sizes, rng.uniform(0, 0.8) * sum(sizes), rng.choice((2, 3, 5, 8))))
    return out


ROUNDED = ("your plan is the best one for the sizes and budget rounded down to whole MB, not "
           "for these: compare the sizes as they are (a table indexed by whole megabytes, as a "
           "knapsack over integers keeps, rounds them; with a few layers, try every subset)")


def _rounded_best(sizes: list[float], budget: float, plan: list[bool], d: int) -> bool:
    """The plan is optimal for the problem with every size and the budget floored to whole MB
    (and that problem differs from the real one): what an integer knapsack returns."""
    floored = [math.floor(s / 1e6) * 1e6 for s in sizes]
    cap = math.floor(budget / 1e6) * 1e6
    if floored == sizes and cap == budget:
        return False
    peak, moved = _cost(floored, plan, d)
    return peak <= cap and moved <= _best_moved(floored, cap, d) * (1 + 1e-9)


def _check_type(got: Any, n: int, label: str) -> None:
    if isinstance(got, (list, tuple)) and len(got) == n and all(
            type(x).__name__ in ("bool", "bool_") for x in got):
        return
    hint = f"return a list of {n} bools, one per layer, in the order of sizes"
    if isinstance(got, (list, tuple)) and got and all(type(x) is int for x in got):
        hint = ("use True and False, not 1 and 0" if len(got) == n and set(got) <= {0, 1}
                else "those look like the indices of the kept layers: return one bool per "
                "layer, True = reshard (free after forward), False = keep")
    elif isinstance(got, (list, tuple)) and len(got) != n:
        hint = f"one entry per layer: sizes has {n} layers, your plan {len(got)}"
    fail(f"{label} returned {got!r:.120}; expected a list of {n} bools, True for a layer "
         "resharded after forward (freed), False for one kept resident", hint=hint)


@exercise("reshard_plan")
def check_reshard_plan(plan: Callable[..., Any], *, random_cases: int = 0, seed: int = 0,
                       quiet: bool = False) -> None:
    """plan(sizes, budget) -> [reshard_after_forward per layer] over CASES (sizes in bytes),
    then `random_cases` random ones."""
    refs = plan_references()
    not_the_course(plan, "plan_reshard", refs, PLAN_WHAT)
    cases = _cases(random_cases, seed)
    for sizes, budget, d in cases:
        label = (f"plan_reshard(sizes={[round(s / 1e6, 3) for s in sizes]} MB, "
                 f"budget={budget / 1e6:.4g} MB)")
        given = list(sizes)
        got = call(label, plan, given, budget, refs=refs, what=PLAN_WHAT)
        if given != sizes:
            fail(f"{label} changed its input sizes to {[s / 1e6 for s in given]} MB",
                 hint="sort a copy (sorted(sizes), or indices sorted by size), not sizes "
                 "itself: the caller's list must keep its order, and your plan must too")
        _check_type(got, len(sizes), label)
        reshard = [bool(x) for x in got]
        peak, moved = _cost(sizes, reshard, d)
        rounded = _rounded_best(sizes, budget, reshard, d)
        if peak > budget:
            fail(f"{label} keeps {peak / 1e6:.4g} MB resident, over the {budget / 1e6:.4g} MB "
                 "budget", hint=ROUNDED if rounded else "a kept layer (reshard False) holds "
                 "its whole gathered weights from forward to backward; the kept sizes must add "
                 "up to at most the budget")
        best = _best_moved(sizes, budget, d)
        if moved > best * (1 + 1e-9):
            fail(f"{label} over d = {d} ranks: your plan moves {moved / 1e6:.4g} MB per rank, "
                 f"the best plan {best / 1e6:.4g} MB", hint=ROUNDED if rounded else "every "
                 "kept layer saves one all-gather of its size, so keep the set of layers with "
                 "the LARGEST total size that fits the budget; keeping the largest layers first "
                 "can leave budget unused (try every subset, there are few layers)")
    if not quiet:
        print(f"plan_reshard: {len(cases)} cases within budget at the fewest bytes. Passed.")
