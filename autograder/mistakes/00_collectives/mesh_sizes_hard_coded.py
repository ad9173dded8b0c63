"""Mistake: the sizes of the first example written in, (2, 1, 1, 2), not read from the
arguments.

Right on 4 ranks for DP 2 x TP 2 only.

Replaces make_device_mesh (exercise 3).
"""

from torch.distributed.device_mesh import init_device_mesh

CAUGHT_BY = {"check_device_mesh": "read every size from the arguments"}


def make_device_mesh(dp, pp, cp, tp):
    return init_device_mesh(device().type, (2, 1, 1, 2),  # noqa: F821 - the imports cell
                            mesh_dim_names=("dp", "pp", "cp", "tp"))
