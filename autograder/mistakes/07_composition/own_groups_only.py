"""Mistake: each rank creates only the process groups it is a member of.

dist.new_group is a collective over the whole world (the default group): every rank must call
it for every group, in the same order, even for the groups it is not in. Skipping the others
leaves the ranks' calls out of step, so they wait on one another and the run hangs; the
launcher stops it as soon as every rank waits for a call another never makes (about a second,
where it used to take the check's timeout, 20 s).

Replaces build_groups (exercise 1).
"""

import torch.distributed as dist

CAUGHT_BY = {"check_build_groups": "new_group is collective"}


def build_groups(sizes):
    world, rank = dist.get_world_size(), dist.get_rank()
    mine = {}
    for axis in sizes:
        for ranks in axis_groups(world, sizes, axis):  # noqa: F821
            if rank in ranks:  # wrong: the other ranks' groups are never created here
                mine[axis] = dist.new_group(ranks)
    return mine
