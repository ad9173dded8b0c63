"""Mistake: the pieces are joined and cut along dim 0 whatever dim the weight was split on.

Right for a column-parallel weight (wq, wk, wv, gate, up: TP splits the rows), wrong for a
row-parallel one (wo, down: TP splits the columns, dim 1). The hidden test reshards one.

Replaces reshard (exercise).
"""

import torch

CAUGHT_BY = {"check_reshard": "cut along dim 1, the dim TP split (not dim 0)"}


def reshard(pieces, dim, t_new):
    out = [{} for _ in range(t_new)]
    for key in pieces[0]:
        whole = torch.cat([p[key] for p in pieces], 0)  # wrong: dim 0 always
        for r, part in enumerate(whole.chunk(t_new, 0)):
            out[r][key] = part.clone()
    return out
