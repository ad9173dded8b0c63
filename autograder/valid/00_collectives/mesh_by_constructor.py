"""Valid: the mesh made by DeviceMesh's constructor from the grid itself,
torch.arange(world).view(dp, pp, cp, tp), rather than by init_device_mesh."""

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import DeviceMesh

PASSES = ["check_device_mesh"]


def make_device_mesh(dp, pp, cp, tp):
    grid = torch.arange(dist.get_world_size()).view(dp, pp, cp, tp)
    return DeviceMesh(device().type, grid, mesh_dim_names=("dp", "pp", "cp", "tp"))  # noqa: F821
