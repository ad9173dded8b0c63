"""The other way the exercise names: bisect on the slowest stage's cost, filling stages left
to right; the smallest limit under which the fill needs at most p stages, then that fill cut
into exactly p stages (a stage closed early leaves one layer for each stage still to come)."""

PASSES = ["check_balance"]


def balance(layer_costs, p):
    n = len(layer_costs)

    def over(total, limit):  # a hair of slack: sums in another order round differently
        return total > limit * (1 + 1e-12)

    def stages_needed(limit):
        count, total = 1, 0.0
        for c in layer_costs:
            if over(c, limit):
                return n + 1
            if over(total + c, limit):
                count, total = count + 1, c
            else:
                total += c
        return count

    limits = sorted({sum(layer_costs[i:j]) for i in range(n) for j in range(i + 1, n + 1)})
    lo, hi = 0, len(limits) - 1
    while lo < hi:
        mid = (lo + hi) // 2
        if stages_needed(limits[mid]) <= p:
            hi = mid
        else:
            lo = mid + 1
    counts, total, size = [], 0.0, 0
    for i, c in enumerate(layer_costs):
        if size and (over(total + c, limits[lo]) or n - i <= p - len(counts) - 1):
            counts.append(size)
            total, size = 0.0, 0
        total, size = total + c, size + 1
    return counts + [size]
