"""Mistake: moe_groups forgets CP: dense over dp × ep, experts over dp only.

CP ranks hold other tokens of the same sequences with the same weights, dense and expert
alike: both groups must vary cp too. Right whenever cp = 1.

Replaces moe_groups (exercise 1c); fails the visible EP 2 × CP 2 grid.
"""

import torch
import torch.distributed as dist

CAUGHT_BY = {"check_moe_groups": "both groups vary cp too"}


def moe_groups(sizes):
    world, rank = dist.get_world_size(), dist.get_rank()
    d, p, e, c, t = (sizes.get(a, 1) for a in AXES)  # noqa: F821
    grid = torch.arange(world).view(d, p, e, c, t)
    lines = {"dense": grid.permute(1, 3, 4, 0, 2).reshape(-1, d * e),  # wrong: cp fixed
             "expert": grid.permute(1, 2, 3, 4, 0).reshape(-1, d)}  # wrong: cp fixed
    mine = {}
    for name, groups in lines.items():
        for ranks in groups.tolist():
            group = dist.new_group(ranks)
            if rank in ranks:
                mine[name] = group
    return mine
