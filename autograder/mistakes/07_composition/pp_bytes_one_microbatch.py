"""Mistake: the pipeline's bytes counted for one micro-batch, not the m of a step.

Each of the step's m micro-batches sends its activation forward and its gradient back, so
PP sends m · 2 · 2bsh/t bytes per step; this answer leaves out the m. The check sees the
ratio got / want = 1/m and names it.

Replaces bytes_per_step (exercise 2; nodes_spanned, in the same cell, is right).
"""

import math

CAUGHT_BY = {"check_placement": "one micro-batch's worth: multiply by the m micro-batches"}


def nodes_spanned(groups, gpus_per_node):
    return max(len({r // gpus_per_node for r in g}) for g in groups)


def bytes_per_step(n_params, layers, hidden, seq, *, b, m, tp, pp, dp):
    bsh = b * seq * hidden
    stage = math.ceil(layers / pp)
    tp_bytes = m * stage * 16 * (tp - 1) / tp * bsh
    pp_bytes = 2 * 2 * bsh / tp if pp > 1 else 0.0  # wrong: one micro-batch, no m
    dp_bytes = 2 * (dp - 1) / dp * 2 * n_params / tp * stage / layers
    return {"tp": tp_bytes, "pp": pp_bytes, "dp": dp_bytes}
