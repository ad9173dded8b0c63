"""Mistake: the right entries of every new piece, returned flattened to one dimension.

Replaces reshard (exercise). The pieces are cut along the right dim, then `.reshape(-1)`:
right values, the wrong shape. The check must not say "cut along the other dim" (the other
dim did not change, there is none left): it names the expected shape and the one it got.
"""

import torch

CAUGHT_BY = {"check_reshard": "equal pieces of shape (2, 6); yours is (12,)"}


def reshard(pieces, dim, t_new):
    out = []
    for r in range(t_new):
        new = {}
        for key in pieces[0]:
            whole = torch.cat([p[key] for p in pieces], dim=dim)
            new[key] = whole.chunk(t_new, dim)[r].reshape(-1).clone()  # wrong: flattened
        out.append(new)
    return out
