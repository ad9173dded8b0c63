"""Mistake: the dims named in words, ("data", "pipeline", "context", "tensor").

The grid is right, but code that asks for mesh["tp"] or mesh.get_group("dp") (the course's,
torchtitan's) gets a KeyError.

Replaces make_device_mesh (exercise 3).
"""

from torch.distributed.device_mesh import init_device_mesh

CAUGHT_BY = {"check_device_mesh": "name the dims mesh_dim_names=('dp', 'pp', 'cp', 'tp')"}


def make_device_mesh(dp, pp, cp, tp):
    return init_device_mesh(device().type, (dp, pp, cp, tp),  # noqa: F821 - the imports cell
                            mesh_dim_names=("data", "pipeline", "context", "tensor"))
