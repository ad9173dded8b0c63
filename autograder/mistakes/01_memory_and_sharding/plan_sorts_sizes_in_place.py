"""Mistake: plan_reshard sorts its input in place to try the largest layers first.

`sizes.sort()` reorders the caller's list, and the plan then refers to the sorted order, not
to the layers as given.

Replaces plan_reshard (exercise 3).
"""

import itertools

CAUGHT_BY = {"check_reshard_plan": "changed its input sizes"}


def plan_reshard(sizes, budget):
    sizes.sort(reverse=True)  # wrong: the caller's list, reordered
    best_total, best_keep = 0, ()
    for k in range(len(sizes), 0, -1):
        for keep in itertools.combinations(range(len(sizes)), k):
            total = sum(sizes[i] for i in keep)
            if best_total < total <= budget:
                best_total, best_keep = total, keep
    return [i not in best_keep for i in range(len(sizes))]
