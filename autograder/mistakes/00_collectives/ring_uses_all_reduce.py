"""Mistake: ring_allreduce calls the collective it is meant to build.

The values are right; the exercise is to do the all-reduce's work with send and recv.

Replaces ring_allreduce (exercise 1).
"""

import torch.distributed as dist

CAUGHT_BY = {"check_ring_allreduce": "you called all_reduce"}


def ring_allreduce(x):
    out = x.clone()
    dist.all_reduce(out)  # wrong: the collective itself
    return out
