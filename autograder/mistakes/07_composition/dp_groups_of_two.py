"""Mistake: build_groups pairs every rank r with r + world_size/2 for DP, as if DP were 2.

Written for the capstone's DP 2 × TP 2 (and right there, and on DP 2 × PP 2 × TP 2), it builds
groups of two whatever `sizes` says: with DP 3 × TP 2 on 6 ranks the DP group of rank 0 must be
[0, 2, 4], not [0, 3]. The other axes come from axis_groups and are right.

Replaces build_groups (exercise 1b); fails the visible check's DP 4 grid on 4 ranks (groups
[0, 2] and [1, 3], not all four) and the hidden 6-rank one.
"""

import torch.distributed as dist

CAUGHT_BY = {"check_build_groups": "take every size from `sizes`"}


def build_groups(sizes):
    world, rank = dist.get_world_size(), dist.get_rank()
    mine = {}
    for axis in sizes:
        if axis == "dp":
            half = world // 2
            lines = [[r, r + half] for r in range(half)]  # wrong: DP taken to be 2
        else:
            lines = axis_groups(world, sizes, axis)  # noqa: F821
        for ranks in lines:
            group = dist.new_group(ranks)
            if rank in ranks:
                mine[axis] = group
    return mine
