"""parlab.mesh: the rank grid and its groups, against examples worked out by hand.

With the grid `arange(world).view(dp, pp, ep, cp, tp)` a rank's number is
rank = (((dp_i · pp + pp_i) · ep + ep_i) · cp + cp_i) · tp + tp_i, so every example below
can be checked with pencil and paper; the expected lists are written out, not computed.
"""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist

from parlab.launch import RankError, run
from parlab.mesh import AXES, make_mesh, new_groups

# world, sizes, axis -> every group along it, worked out by hand
EXAMPLES = [
    (8, {"dp": 2, "pp": 2, "tp": 2}, {
        "tp": [[0, 1], [2, 3], [4, 5], [6, 7]],
        "pp": [[0, 2], [1, 3], [4, 6], [5, 7]],
        "dp": [[0, 4], [1, 5], [2, 6], [3, 7]],
    }),
    (4, {"dp": 2, "tp": 2}, {
        "tp": [[0, 1], [2, 3]],
        "dp": [[0, 2], [1, 3]],
        "pp": [[0], [1], [2], [3]],
    }),
    (12, {"dp": 3, "pp": 2, "tp": 2}, {
        "tp": [[0, 1], [2, 3], [4, 5], [6, 7], [8, 9], [10, 11]],
        "pp": [[0, 2], [1, 3], [4, 6], [5, 7], [8, 10], [9, 11]],
        "dp": [[0, 4, 8], [1, 5, 9], [2, 6, 10], [3, 7, 11]],
    }),
    (8, {"dp": 2, "cp": 2, "tp": 2}, {
        "tp": [[0, 1], [2, 3], [4, 5], [6, 7]],
        "cp": [[0, 2], [1, 3], [4, 6], [5, 7]],
        "dp": [[0, 4], [1, 5], [2, 6], [3, 7]],
    }),
    (16, {"dp": 2, "pp": 2, "ep": 2, "tp": 2}, {
        "tp": [[0, 1], [2, 3], [4, 5], [6, 7], [8, 9], [10, 11], [12, 13], [14, 15]],
        "ep": [[0, 2], [1, 3], [4, 6], [5, 7], [8, 10], [9, 11], [12, 14], [13, 15]],
        "pp": [[0, 4], [1, 5], [2, 6], [3, 7], [8, 12], [9, 13], [10, 14], [11, 15]],
        "dp": [[0, 8], [1, 9], [2, 10], [3, 11], [4, 12], [5, 13], [6, 14], [7, 15]],
    }),
    (6, {"pp": 3, "tp": 2}, {
        "tp": [[0, 1], [2, 3], [4, 5]],
        "pp": [[0, 2, 4], [1, 3, 5]],
        "dp": [[0], [1], [2], [3], [4], [5]],
    }),
]


@pytest.mark.parametrize("world, sizes, expected", EXAMPLES,
                         ids=[f"w{w}-" + "x".join(f"{k}{v}" for k, v in s.items())
                              for w, s, _ in EXAMPLES])
def test_groups_match_hand_examples(world, sizes, expected):
    mesh = make_mesh(world, **sizes)
    for axis, groups in expected.items():
        assert mesh.groups(axis) == groups, axis


def test_every_axis_partitions_the_world():
    mesh = make_mesh(48, dp=2, pp=3, ep=2, cp=2, tp=2)
    for axis in AXES:
        flat = sorted(r for g in mesh.groups(axis) for r in g)
        assert flat == list(range(48)), axis
        assert all(len(g) == mesh.sizes[axis] for g in mesh.groups(axis))


def test_coordinates_follow_the_rank_formula():
    dp, pp, ep, cp, tp = 2, 3, 2, 2, 2
    mesh = make_mesh(48, dp=dp, pp=pp, ep=ep, cp=cp, tp=tp)
    for rank in range(48):
        c = mesh.coords(rank)
        assert ((((c["dp"] * pp + c["pp"]) * ep + c["ep"]) * cp + c["cp"]) * tp + c["tp"]
                == rank)
        for axis in AXES:  # the group along an axis varies only that coordinate
            others = [mesh.coords(r) for r in mesh.group_of(axis, rank)]
            assert [o[axis] for o in others] == list(range(mesh.sizes[axis]))
            assert all({k: v for k, v in o.items() if k != axis}
                       == {k: v for k, v in c.items() if k != axis} for o in others)


def test_tp_groups_stay_inside_an_8_gpu_node():
    """The quiz's 512 GPUs as TP 8 × PP 8 × DP 8: each TP group is one node's 8 GPUs."""
    mesh = make_mesh(512, dp=8, pp=8, tp=8)
    assert all(len({r // 8 for r in g}) == 1 for g in mesh.groups("tp"))
    assert all(len({r // 8 for r in g}) == 8 for g in mesh.groups("pp"))
    assert all(len({r // 8 for r in g}) == 8 for g in mesh.groups("dp"))
    assert mesh.groups("tp")[5] == list(range(40, 48))


@pytest.mark.parametrize("world, sizes, phrase", [
    (8, {"dp": 2, "tp": 2}, "multiply to 4"),
    (4, {"dp": 0, "tp": 4}, "positive integer"),
    (4, {"tp": 2.0, "dp": 2}, "positive integer"),
])
def test_bad_sizes_say_what_is_wrong(world, sizes, phrase):
    with pytest.raises(ValueError, match=phrase):
        make_mesh(world, **sizes)


def test_unknown_axis_and_rank_are_named():
    mesh = make_mesh(4, dp=2, tp=2)
    with pytest.raises(ValueError, match="unknown axis 'xp'"):
        mesh.groups("xp")
    with pytest.raises(ValueError, match="rank 4 is outside"):
        mesh.coords(4)


def test_new_groups_needs_a_process_group():
    with pytest.raises(RuntimeError, match="torch.distributed initialised"):
        new_groups(make_mesh(1))


def _sum_ranks_per_axis(sizes: dict[str, int]) -> dict[str, float]:
    mesh = make_mesh(dist.get_world_size(), **sizes)
    groups = new_groups(mesh, axes=tuple(sizes))
    out = {}
    for axis, group in groups.items():
        x = torch.tensor([float(dist.get_rank())])
        dist.all_reduce(x, group=group)
        out[axis] = x.item()
    return out


@pytest.mark.usefixtures("no_orphans")
def test_process_groups_reduce_over_their_own_ranks():
    """Rank-valued inputs (as Megatron's tests do): each all-reduce sums its group's ranks."""
    results = run(_sum_ranks_per_axis, 4, {"dp": 2, "tp": 2}, timeout=30)
    tp_sums = {0: 1, 1: 1, 2: 5, 3: 5}  # groups {0,1} and {2,3}
    dp_sums = {0: 2, 1: 4, 2: 2, 3: 4}  # groups {0,2} and {1,3}
    assert [r["tp"] for r in results] == [tp_sums[i] for i in range(4)]
    assert [r["dp"] for r in results] == [dp_sums[i] for i in range(4)]


def _groups_for_four() -> None:
    new_groups(make_mesh(4, dp=2, tp=2))


@pytest.mark.usefixtures("no_orphans")
def test_new_groups_rejects_a_mesh_of_another_size():
    with pytest.raises(RankError, match="the mesh has 4 ranks"):
        run(_groups_for_four, 2, timeout=30)
