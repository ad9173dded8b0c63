"""Mistake: the plan as a knapsack table over whole megabytes (sizes and budget rounded down).

A 0/1 knapsack indexed by capacity needs whole numbers, so the sizes are cut to whole MB: exact
for the fixed cases, whose sizes are all whole MB, and wrong where they are not (a kept set can
run over the budget, or miss the best one). The visible test now adds random cases.

Replaces plan_reshard (exercise 3).
"""

CAUGHT_BY = {"check_reshard_plan": "rounded down to whole MB"}


def plan_reshard(sizes, budget):
    mb = [int(s // 1e6) for s in sizes]  # wrong: the fractions of a MB are lost
    cap = int(budget // 1e6)
    best = [(0, ())] * (cap + 1)  # best[c]: (largest kept total, kept layers) within c MB
    for i, size in enumerate(mb):
        for c in range(cap, size - 1, -1):
            total, kept = best[c - size]
            if total + size > best[c][0]:
                best[c] = (total + size, (*kept, i))
    kept = set(best[cap][1])
    return [i not in kept for i in range(len(sizes))]
