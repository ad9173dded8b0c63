"""Mistake: the rank grid is laid out the other way round, TP outermost and DP innermost.

Listing the axes innermost first puts the DP coordinate in the fastest-changing position, so
ranks 0 and 1 differ in DP and the TP groups are strided (0, 2, ...) instead of consecutive.
The course's grid, like Megatron's, is torch.arange(world_size).view(dp, pp, ep, cp, tp): TP
innermost, so a TP group is a run of neighbouring ranks and stays inside one node (NVLink).

Replaces axis_groups and AXES (exercise 1).
"""

import torch

CAUGHT_BY = {"check_axis_groups": "TP is the innermost axis"}

AXES = ("tp", "cp", "ep", "pp", "dp")  # wrong: outermost first should start with dp


def axis_groups(world_size, sizes, axis):
    shape = [sizes.get(a, 1) for a in AXES]
    grid = torch.arange(world_size).view(*shape)  # (tp, cp, ep, pp, dp): DP innermost
    dim = AXES.index(axis)
    return grid.movedim(dim, -1).reshape(-1, shape[dim]).tolist()
