"""Mistake: only the dims whose size is above 1 (as torchtitan's ParallelDims does).

With DP 2 x TP 2 the mesh is (dp, tp): right groups for those two, but mesh["pp"] and
mesh.get_group("cp") raise KeyError, and on 4 ranks with dp = 4 the mesh has one dim.

Replaces make_device_mesh (exercise 3).
"""

from torch.distributed.device_mesh import init_device_mesh

CAUGHT_BY = {"check_device_mesh": "keep every dim, size 1 included"}


def make_device_mesh(dp, pp, cp, tp):
    used = {name: n for name, n in zip(("dp", "pp", "cp", "tp"), (dp, pp, cp, tp), strict=True)
            if n > 1}
    return init_device_mesh(device().type, tuple(used.values()),  # noqa: F821 - imports cell
                            mesh_dim_names=tuple(used))
