"""Mistake: the pipeline's send is priced as the whole (b, s, h) activation on every TP rank.

With sequence parallelism the activation between stages is split along the sequence over the
TP group, so each TP rank sends only its 1/t shard: m · 2 · 2bsh/t bytes per step, not
m · 2 · 2bsh.

Replaces bytes_per_step (exercise 2; nodes_spanned, in the same cell, is right).
"""

import math

CAUGHT_BY = {"check_placement": "with sequence parallelism each TP rank sends its 1/t shard"}


def nodes_spanned(groups, gpus_per_node):
    return max(len({r // gpus_per_node for r in g}) for g in groups)


def bytes_per_step(n_params, layers, hidden, seq, *, b, m, tp, pp, dp):
    bsh = b * seq * hidden
    stage = math.ceil(layers / pp)
    tp_bytes = m * stage * 16 * (tp - 1) / tp * bsh
    pp_bytes = m * 2 * 2 * bsh if pp > 1 else 0.0  # wrong: not divided by tp
    dp_bytes = 2 * (dp - 1) / dp * 2 * n_params / tp * stage / layers
    return {"tp": tp_bytes, "pp": pp_bytes, "dp": dp_bytes}
