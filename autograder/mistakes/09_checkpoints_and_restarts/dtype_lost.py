"""Mistake: the new pieces are made with torch.zeros(shape), float32 whatever the old pieces
were: right for float32 weights, wrong for bfloat16 ones (and for float64), which DCP loads
in their own dtype.

Replaces reshard (exercise 1).
"""

import torch

CAUGHT_BY = {"check_reshard": "the old pieces' dtype"}


def reshard(pieces, dim, t_new):
    n = pieces[0]["weight"].shape[dim]
    m = n * len(pieces) // t_new
    out = []
    for r in range(t_new):
        lo, hi = r * m, (r + 1) * m
        new = {}
        for key, first in pieces[0].items():
            shape = list(first.shape)
            shape[dim] = m
            piece = torch.zeros(shape)  # the mistake: float32, not first's dtype
            for k, old in enumerate(pieces):
                a, b = max(lo, k * n), min(hi, (k + 1) * n)
                if a < b:
                    piece.narrow(dim, a - lo, b - a).copy_(old[key].narrow(dim, a - k * n, b - a))
            new[key] = piece
        out.append(new)
    return out
