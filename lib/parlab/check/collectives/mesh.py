r"""Module 00, exercise 3: `check_device_mesh(make_device_mesh)`, PyTorch's DeviceMesh against
the course's process grid.

`make_device_mesh(dp, pp, cp, tp)` runs on every rank and returns a `DeviceMesh`. For each
layout, the rank reads off its mesh (plain data): the device type, the dim names, the shape,
the ranks in grid order and, for each of dp, pp, cp and tp, the ranks its process group
connects, found by communication: an all-reduce of this rank's one-hot vector over
`mesh.get_group(axis)` (the sum has a 1 at every rank of the group). The parent compares them
with the course's grid `torch.arange(world).view(dp, pp, cp, tp)` (parlab.mesh's layout, TP
innermost): the group of rank r along an axis is the line of the grid through r along it.
The mesh's device type must be the rank's (`parlab.launch.device().type`: "cpu" here, "cuda"
under NCCL), so that what is sent over its groups can live where the rank's tensors live.

Visible: 4 ranks, layouts (4, 1, 1, 1), (2, 1, 1, 2), (1, 2, 2, 1), (1, 1, 1, 4) (every
axis a size above 1 somewhere; the first tells dims in the wrong order from names that do not
match the sizes); hidden: 8 ranks (2, 2, 1, 2) and
(1, 2, 2, 2), 3 ranks (1, 3, 1, 1) and (1, 1, 3, 1).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any

import torch

from parlab.check._compare import fail
from parlab.check._harness import (
    CHECK_TIMEOUT_S,
    call_learner,
    env,
    exercise,
    not_reexport,
    run_checked,
)

__all__ = ["check_device_mesh", "LAYOUTS", "AXES"]

AXES = ("dp", "pp", "cp", "tp")  # the grid's dims, outermost first
LAYOUTS: dict[int, list[tuple[int, int, int, int]]] = {
    4: [(4, 1, 1, 1), (2, 1, 1, 2), (1, 2, 2, 1), (1, 1, 1, 4)],
    8: [(2, 2, 1, 2), (1, 2, 2, 2)],
    3: [(1, 3, 1, 1), (1, 1, 3, 1)],
}
BUILD = ("return init_device_mesh(device().type, (dp, pp, cp, tp), "
         "mesh_dim_names=('dp', 'pp', 'cp', 'tp'))")
DEVICE = ("build the mesh on this rank's device type, parlab.launch.device().type ('cpu' on "
          "gloo, 'cuda' under NCCL), never a fixed string: DeviceMesh accepts any type, and "
          "the mistake shows only when a collective gets a tensor on the wrong device")
ORDER = ("the grid's dims are (dp, pp, cp, tp), outermost first: TP innermost, so ranks that "
         "differ only in their tp coordinate are consecutive (one node), as in "
         "torch.arange(world).view(dp, pp, cp, tp); give the sizes and the names in that order")
NAMES = ("name the dims mesh_dim_names=('dp', 'pp', 'cp', 'tp'): the names the course's code "
         "(and torchtitan's) asks for, as mesh['tp'] or mesh.get_group('dp')")
PAIRS = ("mesh_dim_names[i] names the i-th size of the mesh's shape: the names are in another "
         "order than the sizes, so each name points at another axis's dim")
KEEP = ("keep every dim, size 1 included, as the course's grid does: code that asks for "
        "mesh['pp'] or mesh.get_group('cp') finds it whatever the plan, and a dim of size 1 "
        "costs nothing (groups of one rank)")
SIZES = "read every size from the arguments (dp, pp, cp, tp), never a fixed number"


def _one_hot_members(group: Any, rank: int, world: int, dev: Any) -> list[int]:
    import torch.distributed as dist

    probe = torch.zeros(world, device=dev)
    probe[rank] = 1.0
    dist.all_reduce(probe, group=group)  # sums the one-hots of the group's ranks
    return [int(i) for i in probe.nonzero().flatten().tolist()]


def _describe(mesh: Any, rank: int, world: int, dev: Any) -> dict:
    """In the rank: what the learner's mesh is, as plain data."""
    from torch.distributed.device_mesh import DeviceMesh

    if not isinstance(mesh, DeviceMesh):
        return {"type": type(mesh).__name__}
    names = list(mesh.mesh_dim_names) if mesh.mesh_dim_names else None
    out: dict[str, Any] = {"type": "DeviceMesh", "device": str(mesh.device_type),
                           "names": names, "shape": list(mesh.mesh.shape),
                           "ranks": [int(r) for r in mesh.mesh.flatten().tolist()],
                           "groups": {}}
    for axis in AXES:
        if names and axis in names:  # the same on every rank: the same code made it
            out["groups"][axis] = _one_hot_members(mesh.get_group(axis), rank, world, dev)
    return out


def _probe(make_device_mesh: Callable[..., Any], layouts: list[tuple[int, ...]]) -> list[dict]:
    rank, world, dev = env()
    found = []
    for sizes in layouts:
        mesh = call_learner(f"make_device_mesh{tuple(sizes)}", make_device_mesh, *sizes,
                            hint=f"{BUILD}; the sizes multiply to the world size ({world})")
        found.append(_describe(mesh, rank, world, dev))
    return found


def _names_hint(names: list[str], shape: list[int], sizes: tuple[int, ...]) -> str:
    """What a mesh whose dim names are not (dp, pp, cp, tp) tells about the mistake."""
    if sorted(names) != sorted(AXES):
        return KEEP if set(names) <= set(AXES) else NAMES
    each_on_its_size = dict(zip(names, shape, strict=True)) == dict(zip(AXES, sizes,
                                                                         strict=True))
    if each_on_its_size and tuple(shape) == tuple(sizes):  # this layout cannot tell which
        return f"either {ORDER[4:]}; or {PAIRS[:1].lower()}{PAIRS[1:]}"
    return ORDER if each_on_its_size else PAIRS


def _compare(got: dict, sizes: tuple[int, ...], rank: int, dev_type: str) -> None:
    label = f"make_device_mesh{tuple(sizes)}"
    if got["type"] != "DeviceMesh":
        fail(f"{label} returned a {got['type']}, expected a DeviceMesh", rank=rank, hint=BUILD)
    if got["device"] != dev_type:
        fail(f"{label} made a mesh on device type {got['device']!r}, but this rank's tensors "
             f"live on {dev_type!r}", rank=rank, hint=DEVICE)
    names, shape = got["names"], got["shape"]
    if names is None:
        fail(f"{label} made a mesh of shape {tuple(shape)} without dim names", rank=rank,
             hint=NAMES)
    if names != list(AXES):
        fail(f"{label} made a mesh with mesh_dim_names {tuple(names)} and shape "
             f"{tuple(shape)}; expected names {AXES} and shape {sizes}", rank=rank,
             hint=_names_hint(names, shape, sizes))
    if tuple(shape) != tuple(sizes):
        fail(f"{label} made a mesh of shape {tuple(shape)}, expected {sizes} (dp, pp, cp, tp)",
             rank=rank, hint=SIZES if sorted(shape) != sorted(sizes) else ORDER)
    grid = torch.arange(math.prod(sizes)).view(*sizes)
    if got["ranks"] != grid.flatten().tolist():
        fail(f"{label} holds the ranks in the order {got['ranks']}, expected "
             f"{grid.flatten().tolist()} (rank r at coordinate r of the grid)", rank=rank,
             hint=ORDER)
    for dim, axis in enumerate(AXES):
        line = grid.movedim(dim, -1).reshape(-1, sizes[dim])
        want = next(row.tolist() for row in line if rank in row.tolist())
        if got["groups"].get(axis) != want:
            fail(f"{label}: the {axis} group of rank {rank} connects ranks "
                 f"{got['groups'].get(axis)}, expected {want} (the ranks that differ from it "
                 f"only in their {axis} coordinate)", rank=rank, hint=ORDER)


@exercise("device_mesh")
def check_device_mesh(make_device_mesh: Callable[..., Any], *, world_size: int = 4,
                      layouts: Sequence[tuple[int, int, int, int]] | None = None,
                      timeout: float = CHECK_TIMEOUT_S, quiet: bool = False) -> None:
    """make_device_mesh(dp, pp, cp, tp) on `world_size` ranks, for each layout (default
    LAYOUTS[world_size]), against the grid torch.arange(world).view(dp, pp, cp, tp)."""
    not_reexport(make_device_mesh, name="make_device_mesh")
    cases = list(layouts or LAYOUTS[world_size])
    for sizes in cases:
        if math.prod(sizes) != world_size or len(sizes) != len(AXES):
            raise ValueError(f"layout {sizes} is not (dp, pp, cp, tp) for {world_size} ranks")
    found = run_checked(_probe, world_size, make_device_mesh, cases, timeout=timeout,
                        what="make_device_mesh", hang_hint="every rank must build the same "
                        "meshes, in the same order: init_device_mesh is collective")
    dev_type = _rank_device_type(world_size)
    for rank, meshes in enumerate(found):
        for sizes, got in zip(cases, meshes, strict=True):
            _compare(got, tuple(sizes), rank, dev_type)
    if not quiet:
        print(f"make_device_mesh on {world_size} ranks: {len(cases)} layouts, on every rank "
              "the names, shape, device type and each axis's group match the grid "
              "torch.arange(world).view(dp, pp, cp, tp). Passed.")


def _rank_device_type(world_size: int) -> str:
    """The device type a rank of a `world_size` run gets: 'cuda' on a GPU (NCCL, or every
    rank on one GPU), else 'cpu'."""
    from parlab.launch import devices

    return "cuda" if devices.placement(world_size)[1] else "cpu"
