"""Mistake: bytes_per_step calls parlab.costs.tp_bytes_per_layer instead of writing the formula.

The exercise is the formula itself. A wrapper around the course's own cost function computes
nothing, and it is refused with the same message a bare re-export gets.

Replaces bytes_per_step (exercise 2; nodes_spanned, in the same cell, is right).
"""

import math

from parlab import costs

CAUGHT_BY = {"check_placement": "the course's own reference implementation"}


def nodes_spanned(groups, gpus_per_node):
    return max(len({r // gpus_per_node for r in g}) for g in groups)


def bytes_per_step(n_params, layers, hidden, seq, *, b, m, tp, pp, dp):
    stage = math.ceil(layers / pp)
    tp_bytes = m * stage * costs.tp_bytes_per_layer(b, seq, hidden, tp)  # wrong: the reference
    pp_bytes = m * 2 * 2 * b * seq * hidden / tp if pp > 1 else 0.0
    dp_bytes = 2 * (dp - 1) / dp * 2 * n_params / tp * stage / layers
    return {"tp": tp_bytes, "pp": pp_bytes, "dp": dp_bytes}
