r"""Graded checks of module 07, exercise 1: the rank grid and its process groups.

`axis_groups(world_size, sizes, axis)` → every group along `axis`, compared with `parlab.mesh`
(groups in any order, each group's ranks in increasing order) on every axis of grids of 1 to 48
ranks: sizes 2 to 6, DP 2 to 5, TP 2, 3, 4 and 6, all five axes in the largest; `sizes` must
come back unchanged. The visible test runs DP 2 × PP 2 × TP 2, DP 2 × TP 2 and DP 4 × TP 3.
`build_groups(sizes)` → this rank's process group per axis, run on ranks and probed with
rank-valued all-reduces (each must sum exactly the ranks of its group): 4 ranks in the visible
check (DP 2 × TP 2, PP 2 × TP 2, DP 4); the hidden one adds 6 (DP 3 × TP 2) and 8.

A right answer must not depend on: the axis sizes (2 everywhere would hide `view(-1, 2)` and
"pair rank r with r + world/2"), which axes are named in `sizes` (a missing axis has size 1),
the world size, or the order the groups come back in.

While the learner's code runs, parlab.mesh's and parlab.plan's functions refuse to run.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from parlab.check._compare import assert_equal, expect_type, fail
from parlab.check._harness import (
    CHECK_TIMEOUT_S,
    call_learner,
    exercise,
    not_reexport,
    refuse_in_rank,
    run_checked,
)
from parlab.check.composition.common import GRID_REFUSAL, GRIDS, KEYS, grid_references
from parlab.launch import device

__all__ = ["check_axis_groups", "check_build_groups", "BUILD_CASES"]
ORDER = ("TP is the innermost axis: ranks that differ only in their tp coordinate are "
         "consecutive. Build torch.arange(world_size).view(dp, pp, ep, cp, tp) (DP outermost) "
         "and take the lines of the grid along the axis's dimension")
NEW_GROUP = ("dist.new_group is collective over the whole world: every rank must create every "
             "group, in the same order, even the groups it is not in, and keep the one it is in")
SIZES = ("take every size from `sizes` (a missing axis has size 1): a group has as many ranks "
         "as its axis's size, and there are world_size / size groups")
BUILD_CASES: dict[int, list[dict[str, int]]] = {  # world size -> grids of build_groups
    4: [{"dp": 2, "tp": 2}, {"pp": 2, "tp": 2}, {"dp": 4}], 6: [{"dp": 3, "tp": 2}],
    8: [{"dp": 2, "pp": 2, "tp": 2}]}
"""The visible test runs the 4-rank grids, DP 4 among them (an answer that takes an axis to
be 2 fails it); the hidden test the 6- and 8-rank ones."""
VISIBLE_AXIS_GRIDS = (0, 1, 9)  # GRIDS: DP 2 × PP 2 × TP 2, DP 2 × TP 2, DP 4 × TP 3


def _normalised(groups: Any, label: str) -> list[tuple[int, ...]]:
    expect_type(groups, (list, tuple), name=label, what="a list of lists of ranks")
    if not all(isinstance(g, (list, tuple)) for g in groups):
        fail(f"{label} returned {groups!r:.80}, expected a list of lists of ranks",
             hint="return [[ranks of group 0], [ranks of group 1], ...]")
    try:
        return sorted(tuple(int(r) for r in g) for g in groups)
    except (TypeError, ValueError):
        fail(f"{label} returned groups that are not lists of integer ranks: {groups!r:.80}",
             hint="each group is a list of ints (tensor.tolist() gives them)")


def _reversed_grid(world: int, sizes: dict[str, int], axis: str) -> list[tuple[int, ...]]:
    """The groups a learner gets with DP innermost and TP outermost (the order turned round)."""
    from parlab.mesh import AXES, make_mesh

    flipped = make_mesh(world, **{a: sizes.get(b, 1) for a, b in zip(AXES, AXES[::-1],
                                                                       strict=True)})
    return sorted(tuple(g) for g in flipped.groups(AXES[::-1][AXES.index(axis)]))


def _one_grid(axis_groups: Callable, world: int, sizes: dict[str, int]) -> None:
    from parlab.mesh import AXES, make_mesh

    expected_mesh = make_mesh(world, **sizes)
    for axis in AXES:
        label = f"axis_groups({world}, {sizes}, {axis!r})"
        given = dict(sizes)
        raw = call_learner(label, axis_groups, world, given, axis, refuse=grid_references(),
                           refusal=GRID_REFUSAL)
        if given != sizes:
            fail(f"{label} changed its argument sizes to {given}", hint="read `sizes`, do not "
                 "modify it: the caller uses the same dict for every axis")
        got = _normalised(raw, label)
        want = sorted(tuple(g) for g in expected_mesh.groups(axis))
        hint = ORDER if got == _reversed_grid(world, sizes, axis) else SIZES if {
            len(g) for g in got} != {len(want[0])} else (
            "each group holds the ranks that share every coordinate except this axis's")
        assert_equal(got, want, name=label, hint=hint)


@exercise(KEYS["axis_groups"])
def check_axis_groups(axis_groups: Callable[[int, dict, str], list], *,
                      quiet: bool = False) -> None:
    """axis_groups(world_size, sizes, axis) against parlab.mesh on several grids."""
    not_reexport(axis_groups, name="axis_groups")
    grids = GRIDS if quiet else [GRIDS[i] for i in VISIBLE_AXIS_GRIDS]
    for world, sizes in grids:
        _one_grid(axis_groups, world, sizes)
    if not quiet:
        print(f"axis_groups OK: every axis of {len(grids)} grids matches parlab.mesh")


def _probe_groups(build_groups: Callable[[dict], dict], sizes: dict[str, int]) -> dict:
    """In each rank: the learner's groups, then an all-reduce of the rank number in each."""
    import torch
    import torch.distributed as dist

    rank = dist.get_rank()
    refuse_in_rank(grid_references(), GRID_REFUSAL)
    groups = call_learner(f"build_groups({sizes})", build_groups, dict(sizes))
    expect_type(groups, dict, name=f"build_groups({sizes})", what="a dict axis -> group",
                rank=rank)
    sums = {}
    for axis in sorted(sizes):
        if axis not in groups:
            fail(f"build_groups({sizes}) has no group for axis {axis!r}", rank=rank,
                 hint=f"return a group for every axis named in sizes: {sorted(sizes)}")
        x = torch.tensor([float(rank)], device=device())
        call_learner(f"all_reduce over your {axis} group",
                     lambda a=axis, t=x: dist.all_reduce(t, group=groups[a]))
        sums[axis] = int(x.item())
    return sums


def _one_world(build_groups: Callable, world_size: int, sizes: dict[str, int],
               timeout: float) -> None:
    from parlab.mesh import make_mesh

    got = run_checked(_probe_groups, world_size, build_groups, sizes, timeout=timeout,
                      what=f"build_groups({sizes})", hang_hint=NEW_GROUP)
    mesh = make_mesh(world_size, **sizes)
    for rank, sums in enumerate(got):
        for axis in sorted(sizes):
            members = mesh.group_of(axis, rank)
            turned = next(g for g in _reversed_grid(world_size, sizes, axis) if rank in g)
            # what the sum says: the grid turned round, or groups of another size
            hint = (ORDER if sums[axis] == sum(turned) else
                    "each group holds the ranks that share every coordinate except this "
                    "axis's; " + SIZES)
            assert_equal(sums[axis], sum(members), rank=rank,
                         name=f"build_groups({sizes}) on {world_size} ranks: the all-reduce of "
                              f"rank numbers over the {axis} group (ranks {members})",
                         hint=hint)


@exercise(KEYS["build_groups"], needs={KEYS["axis_groups"]: "axis_groups (exercise 1a)"})
def check_build_groups(build_groups: Callable[[dict], dict], *, world_size: int = 4,
                       quiet: bool = False, timeout: float = CHECK_TIMEOUT_S) -> None:
    """build_groups(sizes) on world_size ranks; quiet=True (the hidden test, run right after
    the visible one) on every other world size of BUILD_CASES: each group's all-reduce sums
    exactly its own ranks. timeout: the launcher's, per run (the default leaves 6 and 8 ranks
    on 2 busy cores time to start)."""
    not_reexport(build_groups, name="build_groups")
    worlds = [w for w in sorted(BUILD_CASES) if w != world_size] if quiet else [world_size]
    for world in worlds:
        for sizes in BUILD_CASES[world]:
            _one_world(build_groups, world, sizes, timeout)
    if not quiet:
        print(f"build_groups OK on {world_size} ranks: every group sums exactly its own ranks")
