"""Valid: the sizes gathered by name in a dict (insertion order dp, pp, cp, tp), passed as
keywords, the device type as a string."""

from torch.distributed.device_mesh import init_device_mesh

PASSES = ["check_device_mesh"]


def make_device_mesh(dp, pp, cp, tp):
    sizes = {"dp": dp, "pp": pp, "cp": cp, "tp": tp}
    return init_device_mesh(device_type=str(device().type),  # noqa: F821 - the imports cell
                            mesh_shape=tuple(sizes.values()), mesh_dim_names=tuple(sizes))
