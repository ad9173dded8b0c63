"""Mistake: moe_groups creates only the groups this rank belongs to, as exercise 1b warned.

dist.new_group is collective over the whole world: every rank must call it for every group,
in the same order. Here each rank makes its own dense group and its own expert group only, so
on DP 2 × EP 2 ranks 0 and 2 make [0, 2] where ranks 1 and 3 make [1, 3]: the calls pair up
wrongly, some ranks never return from new_group and the others wait for them in the probe's
all-reduce. The launcher sees every rank waiting for a call another never makes and stops the
run at once (it used to wait out the check's 20 s).

Replaces moe_groups (exercise 1c).
"""

import torch
import torch.distributed as dist

CAUGHT_BY = {"check_moe_groups": "new_group is collective"}


def moe_groups(sizes):
    world, rank = dist.get_world_size(), dist.get_rank()
    d, p, e, c, t = (sizes.get(a, 1) for a in ("dp", "pp", "ep", "cp", "tp"))
    grid = torch.arange(world).view(d, p, e, c, t)
    lines = {"dense": grid.permute(1, 4, 0, 2, 3).reshape(p * t, d * e * c),
             "expert": grid.permute(1, 2, 4, 0, 3).reshape(p * e * t, d * c)}
    mine = {}
    for name, groups in lines.items():
        for ranks in groups.tolist():
            if rank in ranks:  # wrong: the other ranks' groups are never made here
                mine[name] = dist.new_group(ranks)
    return mine
