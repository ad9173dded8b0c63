"""Mistake: the sizes and the names both given innermost first, (tp, cp, pp, dp).

Every name sits on its own size, so the groups have the right sizes, but the grid is laid out
with tp outermost: rank 0's TP group on 4 ranks with tp = 4 is still [0, 1, 2, 3], while with
DP 2 x TP 2 it is [0, 2], ranks a node apart on a real machine.

Replaces make_device_mesh (exercise 3).
"""

from torch.distributed.device_mesh import init_device_mesh

CAUGHT_BY = {"check_device_mesh": "the grid's dims are (dp, pp, cp, tp), outermost first"}


def make_device_mesh(dp, pp, cp, tp):
    return init_device_mesh(device().type, (tp, cp, pp, dp),  # noqa: F821 - the imports cell
                            mesh_dim_names=("tp", "cp", "pp", "dp"))
