"""Mistake: moe_groups takes the dense group from the dp axis alone (build_groups' DP group),
leaving the EP ranks out of it.

The EP ranks hold the same dense weights and train on other rows of the batch: averaging over
dp alone leaves their data out, and the EP ranks' copies of the dense weights drift apart.
The expert group is right.

Replaces moe_groups (exercise 1c); fails the visible DP 2 × EP 2 check.
"""

import torch
import torch.distributed as dist

CAUGHT_BY = {"check_moe_groups": "to them EP is more data parallelism"}


def moe_groups(sizes):
    world, rank = dist.get_world_size(), dist.get_rank()
    d, p, e, c, t = (sizes.get(a, 1) for a in AXES)  # noqa: F821
    grid = torch.arange(world).view(d, p, e, c, t)
    lines = {"dense": grid.permute(1, 2, 3, 4, 0).reshape(-1, d),  # wrong: dp only
             "expert": grid.permute(1, 2, 4, 0, 3).reshape(p * e * t, d * c)}
    mine = {}
    for name, groups in lines.items():
        for ranks in groups.tolist():
            group = dist.new_group(ranks)
            if rank in ranks:
                mine[name] = group
    return mine
