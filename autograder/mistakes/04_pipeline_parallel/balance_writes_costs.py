"""Mistake: balance turns the caller's list of costs into prefix sums, in place.

Replaces balance (exercise 5). The split it returns is the best one, but layer_costs[i] now
holds the cost of layers 0..i: the notebook draws the stages with the same list right after
the call and gets nonsense. The check now compares the list with a copy after the call
(issue 16.6).
"""

CAUGHT_BY = {
    "check_balance": "changed the list of costs it was given",
}


def balance(layer_costs, p):
    n = len(layer_costs)
    for i in range(1, n):
        layer_costs[i] += layer_costs[i - 1]  # wrong: the caller's list becomes prefix sums
    prefix = [0.0] + list(layer_costs)
    best = {(0, 0): (0.0, 0)}
    for k in range(1, p + 1):
        for j in range(k, n + 1):
            best[(k, j)] = min((max(best[(k - 1, i)][0], prefix[j] - prefix[i]), i)
                               for i in range(k - 1, j) if (k - 1, i) in best)
    counts, j = [], n
    for k in range(p, 0, -1):
        i = best[(k, j)][1]
        counts.append(j - i)
        j = i
    return counts[::-1]
