r"""The rank grid of a composed run, and one process group per axis.

Every plan of module 07 is a product of axis sizes,
$\text{world} = d_\text{dp}\, p_\text{pp}\, e_\text{ep}\, c_\text{cp}\, t_\text{tp}$,
and every rank has one coordinate on each axis. As in picotron, the whole layout is one tensor:

    grid = torch.arange(world).view(dp, pp, ep, cp, tp)      # TP innermost, DP outermost

Ranks that differ only in their tp coordinate are consecutive numbers, so with 8 ranks to a
node a TP group whose size divides 8 sits inside one node (NVLink; a TP of 3 puts ranks 6, 7, 8
on two nodes); the next axes out (cp, ep) come next,
then pp, and dp spans the most nodes. This is Megatron's order (TP, then CP/EP, then PP, then
DP). Megatron folds EP into the DP×CP ranks of the expert layers; here EP is an axis of its own,
which is the same thing when the dense layers' dp is read as dp×ep.

A group along an axis is a line of the grid: fix every other coordinate, let that one run.

    mesh = make_mesh(8, dp=2, tp=2, pp=2)
    mesh.groups("tp")        # [[0, 1], [2, 3], [4, 5], [6, 7]]
    mesh.groups("pp")        # [[0, 2], [1, 3], [4, 6], [5, 7]]
    mesh.groups("dp")        # [[0, 4], [1, 5], [2, 6], [3, 7]]
    groups = new_groups(mesh)   # on every rank, inside a process group: {"tp": ..., "dp": ...}
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.distributed as dist

AXES: tuple[str, ...] = ("dp", "pp", "ep", "cp", "tp")  # outermost first; the grid's dim order


@dataclass(frozen=True)
class Mesh:
    """A rank grid: `grid[dp, pp, ep, cp, tp]` is the global rank with those coordinates."""

    grid: torch.Tensor  # (dp, pp, ep, cp, tp), int64

    @property
    def world_size(self) -> int:
        return self.grid.numel()

    @property
    def sizes(self) -> dict[str, int]:
        """Axis name → size, outermost first."""
        return dict(zip(AXES, self.grid.shape, strict=True))

    def coords(self, rank: int) -> dict[str, int]:
        """Axis name → this rank's coordinate on it."""
        _rank_in(rank, self.world_size)
        index = (self.grid == rank).nonzero()[0].tolist()
        return dict(zip(AXES, index, strict=True))

    def groups(self, axis: str) -> list[list[int]]:
        """Every group along `axis`: the ranks that differ only in that coordinate."""
        dim = _axis(axis)
        lines = self.grid.movedim(dim, -1).reshape(-1, self.grid.shape[dim])
        return [line.tolist() for line in lines]

    def group_of(self, axis: str, rank: int) -> list[int]:
        """The ranks in `rank`'s group along `axis`, in coordinate order."""
        _rank_in(rank, self.world_size)
        return next(g for g in self.groups(axis) if rank in g)

    def describe(self) -> str:
        """One line: the sizes and which axes are trivial."""
        return " × ".join(f"{a.upper()} {n}" for a, n in self.sizes.items() if n > 1) or "1 rank"


def make_mesh(world_size: int, *, dp: int = 1, tp: int = 1, pp: int = 1, cp: int = 1,
              ep: int = 1) -> Mesh:
    """The grid `torch.arange(world_size).view(dp, pp, ep, cp, tp)`, after checking the sizes."""
    sizes = {"dp": dp, "pp": pp, "ep": ep, "cp": cp, "tp": tp}
    for name, n in sizes.items():
        if not isinstance(n, int) or isinstance(n, bool) or n < 1:
            raise ValueError(f"{name}={n!r}: every axis size must be a positive integer "
                             "(1 for an axis you do not use)")
    product = dp * pp * ep * cp * tp
    if product != world_size:
        used = " × ".join(f"{k} {v}" for k, v in sizes.items() if v > 1) or "all axes 1"
        raise ValueError(f"the axis sizes multiply to {product} ({used}) but world_size is "
                         f"{world_size}: choose sizes whose product is the number of ranks")
    return Mesh(torch.arange(world_size).view(dp, pp, ep, cp, tp))


def new_groups(mesh: Mesh, *, axes: tuple[str, ...] = AXES,
               backend: str | None = None) -> dict[str, dist.ProcessGroup]:
    """This rank's process group along each axis in `axes`.

    Call it on every rank, in the same order: `dist.new_group` is collective over the whole
    world, even for the groups a rank is not in, so every rank creates every group. Needs an
    initialised default group whose size is the mesh's world size.
    """
    if not dist.is_initialized():
        raise RuntimeError("new_groups needs torch.distributed initialised: call it inside "
                           "parlab.launch.run (or after dist.init_process_group under torchrun)")
    if dist.get_world_size() != mesh.world_size:
        raise ValueError(f"the mesh has {mesh.world_size} ranks ({mesh.describe()}) but the "
                         f"world has {dist.get_world_size()}: build the mesh for this world")
    rank, mine = dist.get_rank(), {}
    for axis in axes:
        for ranks in mesh.groups(axis):
            group = dist.new_group(ranks, backend=backend)
            if rank in ranks:
                mine[axis] = group
    return mine


def _axis(axis: str) -> int:
    if axis not in AXES:
        raise ValueError(f"unknown axis {axis!r}: use one of {', '.join(AXES)}")
    return AXES.index(axis)


def _rank_in(rank: int, world_size: int) -> None:
    if not 0 <= rank < world_size:
        raise ValueError(f"rank {rank} is outside this mesh of {world_size} ranks "
                         f"(0..{world_size - 1})")
