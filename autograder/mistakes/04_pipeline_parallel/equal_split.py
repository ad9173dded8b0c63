"""Mistake: balance gives every stage the same number of layers.

The first stage also runs the embedding and the last the LM head, so the last stage is the
slowest and sets the pace of the whole pipeline. Replaces balance (exercise 5).
"""

CAUGHT_BY = {
    "check_balance": "an equal split ignores",
}


def balance(layer_costs, p):
    n = len(layer_costs)
    return [n // p + (1 if k < n % p else 0) for k in range(p)]
