"""Mistake: a DeviceMesh made from a grid laid out innermost first, then permuted to
(dp, pp, cp, tp).

Shape and names are right, but the ranks are in another order: with DP 2 x TP 2 the grid is
[[0, 2], [1, 3]], so rank 0's TP group is [0, 2], not [0, 1].

Replaces make_device_mesh (exercise 3).
"""

import torch
from torch.distributed.device_mesh import DeviceMesh

CAUGHT_BY = {"check_device_mesh": "holds the ranks in the order"}


def make_device_mesh(dp, pp, cp, tp):
    grid = torch.arange(dp * pp * cp * tp).view(tp, cp, pp, dp).permute(3, 2, 1, 0)
    return DeviceMesh(device().type, grid,  # noqa: F821 - the imports cell
                      mesh_dim_names=("dp", "pp", "cp", "tp"))
