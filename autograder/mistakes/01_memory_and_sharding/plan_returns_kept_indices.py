"""Mistake: plan_reshard returns the indices of the kept layers, not one bool per layer.

Replaces plan_reshard (exercise 3).
"""

import itertools

CAUGHT_BY = {"check_reshard_plan": "those look like the indices of the kept layers"}


def plan_reshard(sizes, budget):
    best_total, best_keep = 0, ()
    for k in range(len(sizes), 0, -1):
        for keep in itertools.combinations(range(len(sizes)), k):
            total = sum(sizes[i] for i in keep)
            if best_total < total <= budget:
                best_total, best_keep = total, keep
    return list(best_keep)  # wrong: indices, not [reshard per layer]
