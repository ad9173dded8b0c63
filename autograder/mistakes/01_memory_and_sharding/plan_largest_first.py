"""Mistake: keep the largest layers first while they fit (greedy).

Greedy can leave budget unused: with sizes [9, 7, 6, 4, 2] MB and 12 MB it keeps 9 + 2 = 11,
while 6 + 4 + 2 = 12 fits and saves more all-gathers.

Replaces plan_reshard (exercise 3).
"""

CAUGHT_BY = {"check_reshard_plan": "keeping the largest layers first can leave budget unused"}


def plan_reshard(sizes, budget):
    order = sorted(range(len(sizes)), key=lambda i: -sizes[i])
    keep, room = set(), budget
    for i in order:
        if sizes[i] <= room:
            keep.add(i)
            room -= sizes[i]
    return [i not in keep for i in range(len(sizes))]
