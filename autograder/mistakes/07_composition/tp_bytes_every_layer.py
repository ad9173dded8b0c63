"""Mistake: TP's bytes counted for every layer of the model, not the fullest stage's.

With a pipeline, one GPU runs only its stage's ceil(L/p) layers, so its TP all-reduces are
m · ceil(L/p) · 16 (t-1)/t · bsh bytes; this answer multiplies by all L layers. The check
sees the ratio got / want = L / ceil(L/p) and names it.

Replaces bytes_per_step (exercise 2; nodes_spanned, in the same cell, is right).
"""

import math

CAUGHT_BY = {"check_placement": "every layer's worth: one GPU's stage holds only ceil(L/p)"}


def nodes_spanned(groups, gpus_per_node):
    return max(len({r // gpus_per_node for r in g}) for g in groups)


def bytes_per_step(n_params, layers, hidden, seq, *, b, m, tp, pp, dp):
    bsh = b * seq * hidden
    stage = math.ceil(layers / pp)
    tp_bytes = m * layers * 16 * (tp - 1) / tp * bsh  # wrong: every layer, not the stage's
    pp_bytes = m * 2 * 2 * bsh / tp if pp > 1 else 0.0
    dp_bytes = 2 * (dp - 1) / dp * 2 * n_params / tp * stage / layers
    return {"tp": tp_bytes, "pp": pp_bytes, "dp": dp_bytes}
