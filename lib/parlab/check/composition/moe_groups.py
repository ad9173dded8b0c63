r"""Graded check of module 07, exercise 1c: the two data-parallel groups of a grid with EP.

`moe_groups(sizes)` is called on every rank inside a process group, like exercise 1b's
`build_groups`, and returns `{"dense": group, "expert": group}`: the group that averages this
rank's dense gradients (the ranks with its pp and tp coordinates: dp × ep × cp vary) and the one
that reduces its expert gradients (its pp, ep and tp: dp × cp vary). Each group is probed by an
all-reduce of a one-hot vector of the rank numbers: the sum is exactly the group's membership,
compared with the ranks that share this rank's coordinates on the fixed axes
(`parlab.compose.grid.gradient_groups`, `make_grid`'s `dp` and `expert_dp`). Visible: 4 ranks,
DP 2 × EP 2, EP 2 × CP 2 and EP 2 × TP 2 (a dense group of 2 in a world of 4); hidden: 8
ranks, DP 2 × EP 2 × TP 2, PP 2 × EP 2 × CP 2 and DP 4 × EP 2, every grid in one run per world
size.

A right answer must not depend on: the world size against the groups' sizes (the visible
EP 2 × TP 2 grid has groups of 2 in a world of 4), which axes are named in `sizes` (a missing
axis has size 1), the axes' sizes (DP 4, hidden), or the order in which the ranks create the
groups, as long as every rank creates every group in the same order.

A wrong membership is compared with the groups of the likely mistakes (the EP ranks left out of
the dense group, experts averaged over the dense group, CP forgotten, TP or PP let vary, the
grid's axes in another order) and named. While the learner's code runs, parlab's grids
(`parlab.mesh`, `parlab.compose.grid`) and gradient reductions refuse to run.
"""

from __future__ import annotations

import itertools
import sys
from collections.abc import Callable
from typing import Any

import torch

from parlab.check._compare import expect_type, fail
from parlab.check._harness import (
    CHECK_TIMEOUT_S,
    call_learner,
    env,
    exercise,
    not_reexport,
    refuse_in_rank,
    run_checked,
)
from parlab.check.composition.common import GRID_REFUSAL, KEYS
from parlab.errors import reference_message

__all__ = ["check_moe_groups", "GROUP_CASES", "NAMES", "references", "call_guarded",
           "expected_members", "mistaken_members", "REFUSAL", "HINTS"]

NAMES = ("dense", "expert")
AXES = ("dp", "pp", "ep", "cp", "tp")
GROUP_CASES: dict[str, dict[int, list[dict[str, int]]]] = {
    "visible": {4: [{"dp": 2, "ep": 2}, {"ep": 2, "cp": 2}, {"ep": 2, "tp": 2}]},
    "hidden": {8: [{"dp": 2, "ep": 2, "tp": 2}, {"pp": 2, "ep": 2, "cp": 2},
                   {"dp": 4, "ep": 2}]}}
"""World size -> the grids moe_groups is called on, in one run (the visible test; quiet=True,
the hidden test, run right after it in the same cell, adds the hidden ones)."""
REFUSAL = GRID_REFUSAL + " or parlab's gradient reductions"
GUARDED = ("parlab.compose", "parlab.capstone", "parlab.dp", "parlab.plan")
VARY = {"dense": ("dp", "ep", "cp"), "expert": ("dp", "cp")}  # the axes each group runs over
HINTS = {
    "ep_left_out": (
        "the dense weights (attention, router, shared experts, norms) are copied on every EP "
        "rank, which trains on other rows of the batch: to them EP is more data parallelism. "
        "The dense group varies dp, ep and cp (pp and tp fixed)"),
    "experts_mixed": (
        "the EP ranks of a group hold different experts: a group over them mixes different "
        "experts' gradients. An expert's copies share this rank's pp, ep and tp coordinates: "
        "the expert group varies dp and cp only"),
    "cp_forgotten": (
        "CP ranks hold other tokens of the same sequences, with the same weights: both groups "
        "vary cp too (dense: dp, ep, cp; expert: dp, cp)"),
    "tp_or_pp": (
        "TP and PP ranks hold different pieces of the model, never copies: no data-parallel "
        "group varies tp or pp"),
    "order": (
        "build the grid as torch.arange(world_size).view(dp, pp, ep, cp, tp), TP innermost and "
        "DP outermost, as in exercise 1a; then fix the coordinates a group does not vary"),
    "swapped": "the two groups are swapped: dense is the larger one (dp × ep × cp)",
}


def references() -> list[Callable[..., Any]]:
    """What refuses to run while a learner's moe_groups or reduce_moe_grads runs: parlab.mesh's
    grid, and those of parlab's grids and reductions that this rank has loaded (importing
    them costs a rank about a second on 2 cores; an answer that imports one is refused after
    its call instead, by `call_guarded`)."""
    from parlab import mesh

    found: list[Callable[..., Any]] = [mesh.make_mesh, mesh.new_groups, mesh.Mesh.groups,
                                       mesh.Mesh.group_of, mesh.Mesh.coords]
    loaded = sys.modules
    if "parlab.compose.grid" in loaded:
        grid = loaded["parlab.compose.grid"]
        found += [grid.make_grid, grid.gradient_groups, grid._custom_groups]
    if "parlab.compose.grads" in loaded:
        grads = loaded["parlab.compose.grads"]
        found += [grads.sum_grads, grads.finalize_grads, grads.data_parallel,
                  grads.sync_data_parallel, grads.bucketed]
    if "parlab.capstone" in loaded:
        found.append(loaded["parlab.capstone"].sync_gradients)
    if "parlab.dp.ddp" in loaded:
        found.append(loaded["parlab.dp.ddp"].BucketedDDP)
    return found


def call_guarded(stage: str, fn: Callable[..., Any], *args: Any) -> Any:
    """`call_learner`, refused afterwards when the call imported parlab's grids or reductions
    (parlab.compose, parlab.capstone, parlab.dp, parlab.plan)."""
    before = set(sys.modules)
    out = call_learner(stage, fn, *args)
    new = [m for m in GUARDED if m in sys.modules and m not in before]
    if new:
        fail(reference_message(f"{new[0]} (imported by {stage.split('(')[0]})"),
             rank=env()[0])
    return out


def _members(world: int, sizes: dict[str, int], vary: tuple[str, ...],
             order: tuple[str, ...] = AXES) -> list[tuple[int, ...]]:
    """Rank -> the ranks sharing its coordinates on every axis not in `vary`, on the grid
    arange(world).view(sizes in `order`) (coordinates by division and remainder)."""
    keys = []
    for r in range(world):
        coords = {}
        for axis in reversed(order):  # the last axis is the innermost
            coords[axis], r = r % sizes.get(axis, 1), r // sizes.get(axis, 1)
        keys.append(tuple(coords[a] for a in AXES if a not in vary))
    lines: dict[tuple[int, ...], list[int]] = {}
    for r, key in enumerate(keys):
        lines.setdefault(key, []).append(r)
    return [tuple(lines[key]) for key in keys]


def expected_members(world: int, sizes: dict[str, int]) -> dict[str, list[tuple[int, ...]]]:
    """name -> rank -> the ranks of its group: the ranks that share its coordinates on every
    axis the group does not vary (tests/test_moe_grid.py holds these equal to
    `parlab.compose.grid.gradient_groups`, make_grid's dp and expert_dp)."""
    return {name: _members(world, sizes, VARY[name]) for name in NAMES}


def mistaken_members(world: int, sizes: dict[str, int]) -> dict[str, list[tuple[str, Any]]]:
    """name -> [(hint key, rank -> members)]: the groups of each likely mistake."""
    used = [a for a in AXES if sizes.get(a, 1) > 1]
    wrong: dict[str, list[tuple[str, Any]]] = {
        "dense": [("ep_left_out", ("dp", "cp")), ("ep_left_out", ("dp",)),
                  ("cp_forgotten", ("dp", "ep")), ("tp_or_pp", ("dp", "ep", "cp", "tp")),
                  ("tp_or_pp", ("dp", "ep", "cp", "pp")), ("swapped", VARY["expert"])],
        "expert": [("experts_mixed", ("dp", "ep", "cp")), ("experts_mixed", ("dp", "ep")),
                   ("cp_forgotten", ("dp",)), ("tp_or_pp", ("dp", "cp", "tp")),
                   ("tp_or_pp", ("dp", "cp", "pp")), ("swapped", VARY["dense"])]}
    out: dict[str, list[tuple[str, Any]]] = {}
    for name, cases in wrong.items():
        out[name] = [(key, _members(world, sizes, vary)) for key, vary in cases]
        orders = {tuple(a for a in order if a in used): order
                  for order in itertools.permutations(AXES)}  # one per order of the used axes
        out[name] += [("order", _members(world, sizes, VARY[name], order))
                      for used_order, order in orders.items() if list(used_order) != used]
    return out


def _probe(moe_groups: Callable[[dict], dict], grids: list[dict[str, int]]) -> list[dict]:
    """In each rank: the learner's groups for each grid, then each group's membership."""
    import torch.distributed as dist

    rank, world, dev = env()
    refuse_in_rank(references(), REFUSAL)
    found = []
    for sizes in grids:
        label = f"moe_groups({sizes})"
        groups = call_guarded(label, moe_groups, dict(sizes))
        expect_type(groups, dict, name=label, what='a dict {"dense": group, "expert": group}',
                    rank=rank)
        members = {}
        for name in NAMES:
            group = groups.get(name)
            if group is None or group == dist.GroupMember.NON_GROUP_MEMBER:
                fail(f"{label}[{name!r}] is {'missing' if name not in groups else group!r}",
                     rank=rank, hint='return {"dense": ..., "expert": ...}, on each rank '
                     "the group that contains it (dist.new_group gives a usable group only "
                     "to its members)")
            onehot = torch.zeros(world, dtype=torch.float64, device=dev)
            onehot[rank] = 1.0
            call_learner(f"an all-reduce over your {name} group of {label}",
                         lambda g=group, x=onehot: dist.all_reduce(x, group=g))
            members[name] = [r for r in range(world) if float(onehot[r]) > 0.5]
        found.append(members)
    return found


def _listed(words: list[str]) -> str:
    return ", ".join(words[:-1]) + " and " + words[-1] if len(words) > 1 else words[0]


def _compare(found: list[list[dict]], world: int, grids: list[dict[str, int]]) -> None:
    for i, sizes in enumerate(grids):
        want = expected_members(world, sizes)
        for name in NAMES:
            got = [tuple(res[i][name]) for res in found]
            if got == want[name]:
                continue
            key = next((k for k, members in mistaken_members(world, sizes)[name]
                        if got == members), None)
            rank = next(r for r in range(world) if got[r] != want[name][r])
            fail(f"moe_groups({sizes}) on {world} ranks: the {name} group of rank {rank} holds "
                 f"ranks {list(got[rank])}, expected {list(want[name][rank])} (the ranks "
                 f"that share its {_listed([a for a in AXES if a not in VARY[name]])} "
                 "coordinates)", rank=rank,
                 hint=HINTS[key] if key else HINTS["order"] + "; " + HINTS[
                     "ep_left_out" if name == "dense" else "experts_mixed"])


@exercise(KEYS["moe_groups"], needs={KEYS["build_groups"]: "build_groups (exercise 1b)"})
def check_moe_groups(moe_groups: Callable[[dict], dict], *, quiet: bool = False,
                     timeout: float = CHECK_TIMEOUT_S) -> None:
    """moe_groups on the visible grids; quiet=True (the hidden test) on the hidden ones."""
    not_reexport(moe_groups, name="moe_groups")
    cases = GROUP_CASES["hidden" if quiet else "visible"]
    hang = ("dist.new_group is collective over the whole world: every rank creates every "
            "group of both kinds, in the same order, and keeps the ones it is in")
    for world, grids in cases.items():
        found = run_checked(_probe, world, moe_groups, grids, what="moe_groups",
                            timeout=timeout, hang_hint=hang)
        _compare(found, world, grids)
    if not quiet:
        shown = "; ".join(" × ".join(f"{a.upper()} {n}" for a, n in g.items())
                          for g in cases[4])
        print(f"moe_groups OK on 4 ranks ({shown}): every dense group sums exactly its "
              "dp × ep × cp ranks, every expert group its dp × cp ranks")
