"""Mistake: a group of consecutive ranks is taken to fill nodes from their first GPU.

ceil(len(group) / gpus_per_node) nodes is right for a TP group only when TP divides the node
size: TP groups of 2, 4 or 8 on nodes of 8 never straddle a boundary. With TP 3 on nodes of 8
the group [6, 7, 8] touches nodes 0 and 1. Strided groups are counted correctly here.

Replaces nodes_spanned (exercise 2; bytes_per_step, in the same cell, is right); fails the
visible check's TP 3 grid (ranks 3, 4, 5 on nodes of 4) and the hidden one on TP 3 and TP 6.
"""

import math

CAUGHT_BY = {"check_placement": "count the distinct nodes of each group"}


def nodes_spanned(groups, gpus_per_node):
    most = 1
    for g in groups:
        if len(g) > 1 and g[1] - g[0] == 1:  # consecutive ranks: a TP group
            most = max(most, math.ceil(len(g) / gpus_per_node))  # wrong: it may straddle
        else:
            most = max(most, len({r // gpus_per_node for r in g}))
    return most


def bytes_per_step(n_params, layers, hidden, seq, *, b, m, tp, pp, dp):
    bsh = b * seq * hidden
    stage = math.ceil(layers / pp)
    tp_bytes = m * stage * 16 * (tp - 1) / tp * bsh
    pp_bytes = m * 2 * 2 * bsh / tp if pp > 1 else 0.0
    dp_bytes = 2 * (dp - 1) / dp * 2 * n_params / tp * stage / layers
    return {"tp": tp_bytes, "pp": pp_bytes, "dp": dp_bytes}
