"""Mistake: every rank draws a (B, T/t, C) mask from the same seeded generator.

The generator is seeded identically on every rank (it has to be, for the single-device masks
to be reproducible), so drawing a mask of the shard's own shape gives every rank the SAME
pattern: token j of every shard is dropped at the same features. The masks are correlated
across the sequence, and none of them is the single device's.

Replaces sp_dropout (exercise 2).
"""

import torch

CAUGHT_BY = {
    "check_sp_dropout": "every rank drew the same (B, T/t, C) mask from the same seed",
    "check_sp_block": "your dropout differs from the single device's",
}


def sp_dropout(x, p_drop, generator):
    keep = torch.rand(x.shape, generator=generator) >= p_drop  # wrong: the shard's shape
    return x * keep / (1 - p_drop)
