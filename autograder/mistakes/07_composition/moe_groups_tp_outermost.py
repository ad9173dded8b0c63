"""Mistake: moe_groups builds the grid with the axes in the other order, TP outermost and DP
innermost: torch.arange(world).view(tp, cp, ep, pp, dp).

The groups then vary and fix the right axis names on the wrong grid: on DP 2 × EP 2 the
expert group pairs ranks 0 and 1, which sit in one EP group and hold different experts.

Replaces moe_groups (exercise 1c); fails the visible DP 2 × EP 2 check.
"""

import torch
import torch.distributed as dist

CAUGHT_BY = {"check_moe_groups": "TP innermost and DP outermost"}


def moe_groups(sizes):
    world, rank = dist.get_world_size(), dist.get_rank()
    d, p, e, c, t = (sizes.get(a, 1) for a in AXES)  # noqa: F821
    grid = torch.arange(world).view(t, c, e, p, d)  # wrong: (tp, cp, ep, pp, dp)
    lines = {"dense": grid.permute(3, 0, 4, 2, 1).reshape(p * t, d * e * c),
             "expert": grid.permute(3, 2, 0, 4, 1).reshape(p * e * t, d * c)}
    mine = {}
    for name, groups in lines.items():
        for ranks in groups.tolist():
            group = dist.new_group(ranks)
            if rank in ranks:
                mine[name] = group
    return mine
