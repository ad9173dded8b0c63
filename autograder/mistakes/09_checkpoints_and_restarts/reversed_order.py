"""Mistake: the old pieces are joined in reverse rank order.

Old piece k holds entries k·n to (k+1)·n of the whole: joined from the last rank first, the
whole tensor comes out with its blocks swapped and every new piece holds the wrong entries.

Replaces reshard (exercise).
"""

import torch

CAUGHT_BY = {"check_reshard": "the pieces are out of order"}


def reshard(pieces, dim, t_new):
    out = [{} for _ in range(t_new)]
    for key in pieces[0]:
        whole = torch.cat([p[key] for p in reversed(pieces)], dim)  # wrong: rank order
        for r, part in enumerate(whole.chunk(t_new, dim)):
            out[r][key] = part.clone()
    return out
