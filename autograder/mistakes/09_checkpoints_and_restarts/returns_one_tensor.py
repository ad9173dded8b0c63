"""Mistake: the answer returns the assembled whole weight instead of the new pieces.

A learner who stops half way (cat, no split) hands back one tensor: the check says what it
expected instead of failing on an index (issue 16.7).

Replaces reshard (exercise).
"""

import torch

CAUGHT_BY = {"check_reshard": "expected a list of 4 dicts, one per new rank"}


def reshard(pieces, dim, t_new):
    return torch.cat([p["weight"] for p in pieces], dim)  # wrong: not pieces, not a list
