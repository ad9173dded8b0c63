"""Mistake: the nodes a group spans are counted from its size, not from its ranks.

ceil(len(group) / gpus_per_node) is the fewest nodes the group could fit in, which is where it
sits only when its ranks are consecutive (a TP group). A DP group's ranks are strided: with 2
GPUs per node, the group [0, 4] touches nodes 0 and 2. Rank r sits on node r // gpus_per_node:
count the distinct nodes of each group.

Replaces nodes_spanned (exercise 2; bytes_per_step, in the same cell, is right).
"""

import math

CAUGHT_BY = {"check_placement": "count the distinct nodes of each group"}


def nodes_spanned(groups, gpus_per_node):
    return max(math.ceil(len(g) / gpus_per_node) for g in groups)  # wrong: ranks, not nodes


def bytes_per_step(n_params, layers, hidden, seq, *, b, m, tp, pp, dp):
    bsh = b * seq * hidden
    stage = math.ceil(layers / pp)
    tp_bytes = m * stage * 16 * (tp - 1) / tp * bsh
    pp_bytes = m * 2 * 2 * bsh / tp if pp > 1 else 0.0
    dp_bytes = 2 * (dp - 1) / dp * 2 * n_params / tp * stage / layers
    return {"tp": tp_bytes, "pp": pp_bytes, "dp": dp_bytes}
