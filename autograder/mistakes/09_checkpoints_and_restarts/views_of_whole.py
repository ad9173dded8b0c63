"""Mistake: the new pieces are slices of the assembled whole tensor, never copied.

Each returned piece is a view into the concatenated whole: a rank that keeps it keeps all of
the whole tensor alive, t_new times the memory of its piece (issue 16.3's hole).

Replaces reshard (exercise).
"""

import torch

CAUGHT_BY = {"check_reshard": "is a view of a"}


def reshard(pieces, dim, t_new):
    out = [{} for _ in range(t_new)]
    for key in pieces[0]:
        whole = torch.cat([p[key] for p in pieces], dim)
        for r, part in enumerate(whole.chunk(t_new, dim)):
            out[r][key] = part  # wrong: a view of `whole`
    return out
