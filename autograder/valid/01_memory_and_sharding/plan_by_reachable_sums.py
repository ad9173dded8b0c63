"""plan_reshard as a knapsack by dynamic programming over the reachable kept totals (a dict
from total to the layers kept), instead of trying every subset: the sizes need not be whole
numbers, so the table is keyed by the sums themselves. Keeping the largest total that fits
moves the fewest bytes."""

PASSES = ["check_reshard_plan"]


def plan_reshard(sizes, budget):
    reachable = {0: ()}  # kept total -> the layers kept
    for i, size in enumerate(sizes):
        for total, kept in list(reachable.items()):
            if total + size <= budget and total + size not in reachable:
                reachable[total + size] = (*kept, i)
    kept = set(reachable[max(reachable)])
    return [i not in kept for i in range(len(sizes))]
