"""Mistake: the sizes in the course's order, the names in the opposite one.

mesh_dim_names[i] names the i-th size: the dim of size dp is called "tp", so
mesh.get_group("tp") hands back the data-parallel group (and the sizes only look right where
dp == tp and pp == cp).

Replaces make_device_mesh (exercise 3).
"""

from torch.distributed.device_mesh import init_device_mesh

CAUGHT_BY = {"check_device_mesh": "mesh_dim_names[i] names the i-th size"}


def make_device_mesh(dp, pp, cp, tp):
    return init_device_mesh(device().type, (dp, pp, cp, tp),  # noqa: F821 - the imports cell
                            mesh_dim_names=("tp", "cp", "pp", "dp"))
