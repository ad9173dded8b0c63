r"""The rank grid of a composed run: this rank's coordinates, its process groups, its tokens.

    grid = make_grid(dp=2, pp=2, tp=2)       # on every rank, inside a process group of 8
    grid.coords                              # {"dp": 1, "pp": 0, "ep": 0, "cp": 0, "tp": 1}
    grid.tp, grid.cp, grid.pp, grid.ep       # the axis groups (parlab.mesh.new_groups)
    grid.dp                                  # dense gradients: the dp × ep × cp ranks
    grid.expert_dp                           # expert gradients: the dp × cp ranks
    gradient_groups(mesh)                    # both as lists of ranks, for every group
    rows = grid.batch_rows(global_batch)     # this replica's rows of every global batch
    pos = grid.positions(16, sequence_parallel=True)   # this rank's positions (CP layout)

The grid is `parlab.mesh.make_mesh`'s `arange(world).view(dp, pp, ep, cp, tp)`, TP innermost.

Expert parallelism is folded into data parallelism, as Megatron does: what Megatron calls
the data-parallel size is `dp × ep` here, and `--expert-model-parallel-size` divides it. The
dense layers treat the dp × ep ranks as one data-parallel group (each holds different rows);
in the MoE layers the ep ranks of a group hold different experts and trade tokens, so an
expert's copies live on the dp × cp ranks that share its ep coordinate. Why fold instead of
adding ranks: an expert layer has E/ep times fewer weights per rank but the same tokens, and
the dense layers would sit idle on ranks of their own; folding keeps every rank busy in both.
(Megatron also lets an EP group span CP ranks, so there EP divides DP × CP; here it divides
DP: the ranks of an EP group share their CP position, one meaning per grid coordinate.)

Tokens: rank (dp, ep) of the data-parallel ranks takes rows `replica*b .. (replica+1)*b` of
the global batch, b = global / (dp·ep); a CP rank keeps the positions of its layout
(`parlab.cp.layout_positions`: contiguous, striped or zigzag) and rotary embeddings use them;
with SP a TP rank holds 1/t of those positions between the TP regions.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
import torch.distributed as dist
from torch import Tensor

from parlab.cp.layout import layout_positions, position_table
from parlab.launch import nccl_rules, uses_nccl
from parlab.mesh import Mesh, make_mesh, new_groups

__all__ = ["Grid", "Positions", "make_grid", "group_size", "gradient_groups"]


def group_size(group: dist.ProcessGroup | None) -> int:
    """Ranks in `group` (1 without torch.distributed)."""
    return dist.get_world_size(group) if dist.is_initialized() else 1


@dataclass(frozen=True)
class Positions:
    """Where this rank's tokens sit in the sequence.

    cp: (n,) global positions this CP rank holds (n = T/cp); table: (cp, n), every CP rank's
    (what ring attention needs); sp: (n/t,) the positions of this TP rank's SP shard."""

    cp: Tensor
    table: Tensor
    sp: Tensor


@dataclass
class Grid:
    """One rank's place in a dp × pp × ep × cp × tp grid and the groups it talks over."""

    mesh: Mesh
    rank: int
    coords: dict[str, int]
    groups: dict[str, dist.ProcessGroup] = field(repr=False)
    layout: str = "contiguous"

    def size(self, axis: str) -> int:
        return self.mesh.sizes[axis]

    @property
    def tp(self) -> dist.ProcessGroup:
        return self.groups["tp"]

    @property
    def cp(self) -> dist.ProcessGroup:
        return self.groups["cp"]

    @property
    def pp(self) -> dist.ProcessGroup:
        return self.groups["pp"]

    @property
    def ep(self) -> dist.ProcessGroup:
        return self.groups["ep"]

    @property
    def dp(self) -> dist.ProcessGroup:
        """Dense gradients: the dp × ep × cp ranks with this rank's pp and tp coordinates."""
        return self.groups["dp"]

    @property
    def expert_dp(self) -> dist.ProcessGroup:
        """Expert gradients: the dp × cp ranks with this rank's pp, ep and tp coordinates."""
        return self.groups["expert_dp"]

    @property
    def p2p(self) -> dist.ProcessGroup | None:
        """A gloo copy of the world for pipeline messages under NCCL (`parlab.compose.pipeline`
        says why); None under gloo: the default group."""
        return self.groups.get("p2p")

    @property
    def embedding(self) -> dist.ProcessGroup | None:
        """The first and last rank of this pipeline (one rank when pp = 1); None on the
        ranks in between, which are in no such group."""
        return self.groups.get("embedding")

    @property
    def pp_ranks(self) -> list[int]:
        """Global ranks of this rank's pipeline, stage-rank 0 first."""
        return self.mesh.group_of("pp", self.rank)

    @property
    def replica(self) -> int:
        """Which data-parallel replica (of dp·ep) this rank belongs to."""
        return self.coords["dp"] * self.size("ep") + self.coords["ep"]

    @property
    def replicas(self) -> int:
        return self.size("dp") * self.size("ep")

    def batch_rows(self, global_batch: int) -> slice:
        """This replica's rows of a global batch of `global_batch` sequences."""
        if global_batch % self.replicas:
            raise ValueError(f"the global batch of {global_batch} does not split over the "
                             f"dp × ep = {self.replicas} data-parallel ranks")
        b = global_batch // self.replicas
        return slice(self.replica * b, (self.replica + 1) * b)

    def positions(self, seq: int, *, sequence_parallel: bool,
                  device: torch.device | None = None) -> Positions:
        """This rank's token positions for sequences of `seq` tokens."""
        cp, t = self.size("cp"), self.size("tp")
        mine = layout_positions(self.layout, self.coords["cp"], cp, seq)  # (n,)
        table = position_table(self.layout, cp, seq)  # (cp, n)
        n = mine.numel()
        if sequence_parallel and n % t:
            raise ValueError(f"{n} tokens per CP rank do not split over tp={t} for SP")
        k = n // t if sequence_parallel else n
        r = self.coords["tp"] if sequence_parallel else 0
        return Positions(mine.to(device), table.to(device), mine[r * k:(r + 1) * k].to(device))


def _lines(grid: Tensor, keep: tuple[int, ...]) -> list[list[int]]:
    """Groups of ranks that share the coordinates of the dims in `keep` (the rest vary)."""
    vary = [d for d in range(grid.dim()) if d not in keep]
    moved = grid.permute(*keep, *vary)
    return [g.flatten().tolist() for g in moved.reshape(-1, *moved.shape[len(keep):])]


def gradient_groups(mesh: Mesh) -> dict[str, list[list[int]]]:
    """The ranks of every data-parallel group, as lists: "dp" (dense gradients: same pp and
    tp, dp × ep × cp vary) and "expert_dp" (expert gradients: same pp, ep and tp, dp × cp
    vary). `make_grid` makes these groups; module 07's MoE exercise checks against them."""
    g = mesh.grid  # (dp, pp, ep, cp, tp)
    return {"dp": _lines(g, (1, 4)), "expert_dp": _lines(g, (1, 2, 4))}


def _custom_groups(mesh: Mesh, rank: int) -> dict[str, dist.ProcessGroup]:
    """The groups that are not lines of one axis; every rank creates every group."""
    wanted = {**gradient_groups(mesh),
              "embedding": [[line[0], line[-1]] for line in mesh.groups("pp")]}
    mine = {}
    for name, lines in wanted.items():
        for ranks in lines:
            group = dist.new_group(sorted(set(ranks)))
            if rank in ranks:
                mine[name] = group
    return mine


def make_grid(*, dp: int = 1, pp: int = 1, tp: int = 1, cp: int = 1, ep: int = 1,
              layout: str = "contiguous") -> Grid:
    """This rank's grid; call on every rank (group creation is collective over the world).

    Groups: "tp", "cp", "pp", "ep" (axis lines), "dp" (dp × ep × cp: dense gradients),
    "expert_dp" (dp × cp: expert gradients), "embedding" (first and last pipeline rank: the
    tied embedding's two copies), and under NCCL "p2p" (gloo, for pipeline messages)."""
    world, rank = dist.get_world_size(), dist.get_rank()
    mesh = make_mesh(world, dp=dp, pp=pp, tp=tp, cp=cp, ep=ep)
    groups = new_groups(mesh, axes=("tp", "cp", "pp", "ep"))
    groups.update(_custom_groups(mesh, rank))
    if uses_nccl() or nccl_rules.watching():  # PARLAB_NCCL_RULES=1 plays NCCL on gloo
        groups["p2p"] = dist.new_group(list(range(world)), backend="gloo")
    return Grid(mesh, rank, mesh.coords(rank), groups, layout)
