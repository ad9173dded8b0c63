"""Mistake: the mesh built on "cuda", written in, whatever the rank's device.

On a CPU-only machine init_device_mesh("cuda", ...) does not fail (measured with torch 2.13's
CPU build: the mesh and its gloo groups are made); the first DTensor placed on it does, with
"Torch not compiled with CUDA enabled". The device type is the rank's: device().type.

Replaces make_device_mesh (exercise 3).
"""

from torch.distributed.device_mesh import init_device_mesh

CAUGHT_BY = {"check_device_mesh": "build the mesh on this rank's device type"}


def make_device_mesh(dp, pp, cp, tp):
    return init_device_mesh("cuda", (dp, pp, cp, tp), mesh_dim_names=("dp", "pp", "cp", "tp"))
