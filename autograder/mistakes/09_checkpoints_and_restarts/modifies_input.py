"""Mistake: the answer zeroes the old pieces as it goes (to "free" them), in place.

The caller still holds those tensors (a real loader would read them from its own buffers): the
exercise promises to leave the input pieces unchanged.

Replaces reshard (exercise).
"""

import torch

CAUGHT_BY = {"check_reshard": "your code modified its input"}


def reshard(pieces, dim, t_new):
    out = [{} for _ in range(t_new)]
    for key in pieces[0]:
        whole = torch.cat([p[key] for p in pieces], dim)
        for r, part in enumerate(whole.chunk(t_new, dim)):
            out[r][key] = part.clone()
        for p in pieces:
            p[key].zero_()  # wrong: in place, on the caller's tensors
    return out
