r"""Graded checks of module 07, "Composition": exercises 1 and 3 here; exercise 2 (placing the
axes on a topology) in `parlab.check.composition_place`, exercise 4 (the capstone) in
`parlab.check.capstone`, both importable from here.

Exercise 1, the rank grid: `axis_groups(world_size, sizes, axis)` → every group along `axis`,
compared with `parlab.mesh` on hand-sized grids (groups in any order, each group's ranks in
increasing order); `build_groups(sizes)` → this rank's process group per axis, run on 4 ranks
and probed with rank-valued all-reduces (each must sum exactly the ranks of its group).
Exercise 3, the practice problems of seed 003: `fit_state(...)` and `tp_vs_pp(...)`, compared
with `parlab.costs` on the seed's numbers and on others (integers exactly, bytes to 1e-9).

While the learner's code runs, parlab.mesh's and parlab.plan's functions raise CheckFailed.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from typing import Any

from parlab import costs
from parlab.check import CheckFailed, assert_equal, fail, not_reexport, ranks
from parlab.errors import refused
from parlab.launch import CollectiveTimeout, RankError

__all__ = ["check_axis_groups", "check_build_groups", "check_fit_state", "check_tp_vs_pp",
           "CheckFailed"]
_LATER = {"check_placement": "composition_place", "check_capstone": "capstone"}
REFERENCE = ("your answer runs parlab.mesh or parlab.plan (plan_costs), the course's own grid and "
             "planner; the exercise is to write it yourself (the grid is "
             "torch.arange(world_size).view(dp, pp, ep, cp, tp))")
ORDER = ("TP is the innermost axis: ranks that differ only in their tp coordinate are "
         "consecutive. Build torch.arange(world_size).view(dp, pp, ep, cp, tp) (DP outermost) "
         "and take the lines of the grid along the axis's dimension")
NEW_GROUP = ("dist.new_group is collective over the whole world: every rank must create every "
             "group, in the same order, even the groups it is not in, and keep the one it is in")
GRIDS = [  # (world_size, sizes): the visible check uses the first two
    (8, {"dp": 2, "pp": 2, "tp": 2}), (4, {"dp": 2, "tp": 2}),
    (12, {"dp": 3, "pp": 2, "tp": 2}), (16, {"dp": 2, "pp": 2, "ep": 2, "tp": 2}),
    (8, {"dp": 2, "cp": 2, "tp": 2}), (24, {"dp": 2, "pp": 3, "tp": 4}), (6, {"pp": 3, "tp": 2}),
    (48, {"dp": 2, "pp": 3, "ep": 2, "cp": 2, "tp": 2}), (1, {}),
]


def _reference_functions() -> list[Callable[..., Any]]:
    from parlab import mesh, plan
    from parlab.plan import costs as plan_costs

    return [mesh.make_mesh, mesh.new_groups, mesh.Mesh.groups, mesh.Mesh.group_of,
            mesh.Mesh.coords, plan_costs.nodes_spanned, plan_costs.axis_bytes, plan.evaluate,
            plan.plan]


def _guarded() -> contextlib.AbstractContextManager[None]:
    return refused(_reference_functions(), REFERENCE)


def _call(stage: str, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    try:
        with _guarded():
            return fn(*args, **kwargs)
    except (NotImplementedError, CheckFailed):
        raise
    except Exception as exc:  # noqa: BLE001 - reported to the learner
        fail(f"{stage} raised {type(exc).__name__}: {exc}", hint="read the error above")


def _normalised(groups: Any, label: str) -> list[tuple[int, ...]]:
    if not isinstance(groups, (list, tuple)) or not all(
            isinstance(g, (list, tuple)) for g in groups):
        fail(f"{label} returned {type(groups).__name__}, expected a list of lists of ranks",
             hint="return [[ranks of group 0], [ranks of group 1], ...]")
    try:
        return sorted(tuple(int(r) for r in g) for g in groups)
    except (TypeError, ValueError):
        fail(f"{label} returned groups that are not lists of integer ranks: {groups!r}")
        raise  # unreachable: fail raises


def _reversed_grid(world: int, sizes: dict[str, int], axis: str) -> list[tuple[int, ...]]:
    """The groups a learner gets with DP innermost and TP outermost (the order turned round)."""
    from parlab.mesh import AXES, make_mesh

    flipped = make_mesh(world, **{a: sizes.get(b, 1) for a, b in zip(AXES, AXES[::-1],
                                                                       strict=True)})
    return sorted(tuple(g) for g in flipped.groups(AXES[::-1][AXES.index(axis)]))


def check_axis_groups(axis_groups: Callable[[int, dict, str], list], *,
                      quiet: bool = False) -> None:
    """axis_groups(world_size, sizes, axis) against parlab.mesh on several grids."""
    from parlab.mesh import AXES, make_mesh

    not_reexport(axis_groups, name="axis_groups")
    grids = GRIDS[:2] if not quiet else GRIDS
    for world, sizes in grids:
        expected_mesh = make_mesh(world, **sizes)
        for axis in AXES:
            label = f"axis_groups({world}, {sizes}, {axis!r})"
            got = _normalised(_call(label, axis_groups, world, dict(sizes), axis), label)
            want = sorted(tuple(g) for g in expected_mesh.groups(axis))
            hint = ORDER if got == _reversed_grid(world, sizes, axis) else (
                "each group holds the ranks that share every coordinate except this axis's; "
                "a group has as many ranks as the axis's size")
            assert_equal(got, want, name=label, hint=hint)
    if not quiet:
        print(f"axis_groups OK: every axis of {len(grids)} grids matches parlab.mesh")


def _probe_groups(build_groups: Callable[[dict], dict], sizes: dict[str, int]) -> dict:
    """In each rank: the learner's groups, then an all-reduce of the rank number in each."""
    import torch
    import torch.distributed as dist

    from parlab.check.composition import _call as call

    groups = call(f"build_groups({sizes})", build_groups, dict(sizes))
    if not isinstance(groups, dict):
        fail(f"build_groups returned {type(groups).__name__}, expected a dict axis -> group",
             rank=dist.get_rank())
    sums = {}
    for axis in sorted(sizes):
        if axis not in groups:
            fail(f"build_groups({sizes}) has no group for axis {axis!r}", rank=dist.get_rank())
        x = torch.tensor([float(dist.get_rank())])
        call(f"all_reduce over your {axis} group", dist.all_reduce, x, group=groups[axis])
        sums[axis] = int(x.item())
    return sums


def check_build_groups(build_groups: Callable[[dict], dict], *, world_size: int = 4,
                       quiet: bool = False) -> None:
    """build_groups(sizes) on world_size ranks: each group's all-reduce sums its own ranks."""
    from parlab.mesh import make_mesh

    not_reexport(build_groups, name="build_groups")
    cases = {4: [{"dp": 2, "tp": 2}, {"pp": 2, "tp": 2}], 8: [{"dp": 2, "pp": 2, "tp": 2}]}
    for sizes in cases[world_size]:
        try:
            got = ranks(_probe_groups, world_size, build_groups, sizes, timeout=10)
        except CollectiveTimeout as exc:
            fail(f"build_groups({sizes}) on {world_size} ranks hung: {exc}", hint=NEW_GROUP)
        except RankError as exc:
            fail(f"build_groups({sizes}) on {world_size} ranks failed: {exc}",
                 hint=NEW_GROUP if "new_group" in str(exc) else None)
        mesh = make_mesh(world_size, **sizes)
        for rank, sums in enumerate(got):
            for axis in sorted(sizes):
                members = mesh.group_of(axis, rank)
                assert_equal(sums[axis], sum(members), rank=rank,
                             name=f"build_groups({sizes}): the all-reduce of rank numbers over "
                                  f"the {axis} group (ranks {members})", hint=ORDER)
    if not quiet:
        print(f"build_groups OK on {world_size} ranks: every group sums exactly its own ranks")


def check_fit_state(fit_state: Callable[..., dict], *, quiet: bool = False) -> None:
    """fit_state(n_params, n_gpus, gpu_bytes, gpus_per_node) against parlab.costs."""
    not_reexport(fit_state, name="fit_state")
    cases = [(70e9, 32, 80e9, 8), (13e9, 16, 80e9, 8), (175e9, 64, 40e9, 8), (7e9, 8, 24e9, 4),
             (405e9, 128, 141e9, 8)]
    for n, gpus, mem, per_node in cases if quiet else cases[:1]:
        label = f"fit_state({n:g}, {gpus}, {mem:g}, {per_node})"
        got = _call(label, fit_state, n, gpus, mem, per_node)
        if not isinstance(got, dict):
            fail(f"{label} returned {type(got).__name__}, expected a dict")
        replica = costs.training_state_bytes(n, "ddp", 1)
        want = {"replica_bytes": replica, "dp_fits": replica <= mem,
                "zero3_bytes": costs.training_state_bytes(n, "zero3", gpus),
                "tp": per_node, "dp": gpus // per_node, "tp_only_bytes": replica / per_node}
        for key, value in want.items():
            _same(got, key, value, label)
    if not quiet:
        print("fit_state OK on practice problem 1 (70B on 32 H100s)")


def check_tp_vs_pp(tp_vs_pp: Callable[..., dict], *, quiet: bool = False) -> None:
    """tp_vs_pp(h, b, s, t, p, max_bubble) against parlab.costs."""
    not_reexport(tp_vs_pp, name="tp_vs_pp")
    cases = [(8192, 1, 8192, 8, 8, 0.15), (4096, 2, 4096, 4, 4, 0.1), (12288, 1, 2048, 8, 16, 0.05),
             (5120, 4, 1024, 2, 6, 0.2)]
    for h, b, s, t, p, x in cases if quiet else cases[:1]:
        label = f"tp_vs_pp(h={h}, b={b}, s={s}, t={t}, p={p}, max_bubble={x})"
        got = _call(label, tp_vs_pp, h, b, s, t, p, x)
        if not isinstance(got, dict):
            fail(f"{label} returned {type(got).__name__}, expected a dict")
        want = {"allreduce_bytes": costs.ring_allreduce_bytes(b * s * h * 2, t),
                "layer_bytes": costs.tp_bytes_per_layer(b, s, h, t),
                "m": costs.min_microbatches(p, x), "m_interleaved": costs.min_microbatches(p, x, 2)}
        for key, value in want.items():
            _same(got, key, value, label)
    if not quiet:
        print("tp_vs_pp OK on practice problem 2 (h = s = 8192, TP 8, PP 8)")


HINTS = {
    "replica_bytes": "one full replica holds 2 + 2 + 12 = 16 bytes per parameter",
    "dp_fits": "plain DP keeps a full replica on every GPU: it fits only if 16 P <= memory",
    "zero3_bytes": "ZeRO-3 shards all 16 bytes per parameter over every GPU: 16 P / n_gpus",
    "tp": "TP fills one node: t = gpus_per_node", "dp": "the nodes are the DP replicas",
    "tp_only_bytes": "TP alone divides the state by t only: 16 P / t, without ZeRO over DP",
    "allreduce_bytes": "a ring all-reduce sends 2 (t-1)/t of the b*s*h bf16 tensor (2 bytes)",
    "layer_bytes": "four all-reduces per layer: two forward, two backward",
    "m": "smallest m with (p-1)/(m+p-1) <= max_bubble",
    "m_interleaved": "with v = 2 chunks per rank the bubble is (p-1)/(2m+p-1): smallest m",
}


def _same(got: dict, key: str, value: Any, label: str) -> None:
    if key not in got:
        fail(f"{label} has no key {key!r}", hint=f"return a dict with {key!r}: {HINTS[key]}")
    v = got[key]
    if isinstance(value, bool) or isinstance(value, int):
        ok = v == value and type(v) is not float if isinstance(value, bool) else v == value
    else:
        ok = isinstance(v, (int, float)) and abs(v - value) <= 1e-9 * abs(value)
    if not ok:
        fail(f"{label}[{key!r}]: expected {value!r}, got {v!r}", hint=HINTS[key])


def __getattr__(name: str) -> Any:
    """Exercises 2 and 4 live in their own files; reached from here."""
    if name in _LATER:
        import importlib

        return getattr(importlib.import_module(f"parlab.check.{_LATER[name]}"), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
