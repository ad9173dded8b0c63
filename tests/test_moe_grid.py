"""MoE in the grid (module 07, exercises 1c and 1d): the dense and expert data-parallel groups,
and an MoE block's gradients reduced over them against one device.

References computed here, independently of parlab's MoE code:
- groups: the ranks that share a rank's coordinates on the fixed axes, enumerated from
  divisions and remainders of the rank number (dense: pp and tp fixed; expert: pp, ep, tp),
  against `parlab.compose.grid.gradient_groups` (make_grid's dp and expert_dp) and the
  check's own expected groups; their sizes against `parlab.moe.data_parallel_sizes`.
- gradients: the block of `parlab.check.composition.moe_grads` on one device, its MoE written
  here densely (every expert on every token, weighted by the top-k softmax gates, zero
  elsewhere), differentiated by autograd in float64; on 4 and 8 ranks, module 06's `ep_moe`
  with make_grid's groups and `parlab.compose.sum_grads` (dense: mean over grid.dp; experts:
  sum over grid.expert_dp over d·e·c) must give the same gradients (rtol 1e-9), with rank 0's
  experts given no token (their .grad None before the reduction).
- a wrong grouping fails: every likely mistake's groups, fed to the check's comparison, fail
  with that mistake's hint.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from parlab import launch
from parlab.check import CheckFailed
from parlab.check.composition import moe_grads, moe_groups
from parlab.moe import data_parallel_sizes, expert_rows

pytestmark = pytest.mark.usefixtures("no_orphans")
AXES = ("dp", "pp", "ep", "cp", "tp")
GRIDS = [(4, {"dp": 2, "ep": 2}), (4, {"ep": 2, "cp": 2}), (8, {"dp": 2, "ep": 2, "tp": 2}),
         (8, {"pp": 2, "ep": 2, "cp": 2}), (8, {"dp": 4, "ep": 2}), (6, {"dp": 3, "tp": 2}),
         (24, {"dp": 2, "pp": 2, "ep": 3, "cp": 2})]


def _coords(rank: int, sizes: dict[str, int]) -> dict[str, int]:
    out = {}
    for axis in reversed(AXES):  # tp innermost
        n = sizes.get(axis, 1)
        out[axis], rank = rank % n, rank // n
    return out


def _group(rank: int, world: int, sizes: dict[str, int], fixed: tuple[str, ...]) -> list[int]:
    mine = _coords(rank, sizes)
    return [r for r in range(world) if all(_coords(r, sizes)[a] == mine[a] for a in fixed)]


@pytest.mark.parametrize("world,sizes", GRIDS, ids=[str(s) for _, s in GRIDS])
def test_gradient_groups_are_the_ranks_sharing_the_fixed_coordinates(world, sizes):
    from parlab.compose.grid import gradient_groups
    from parlab.mesh import make_mesh

    lines = gradient_groups(make_mesh(world, **sizes))
    expected = moe_groups.expected_members(world, sizes)
    dp = data_parallel_sizes(world, pp=sizes.get("pp", 1), tp=sizes.get("tp", 1),
                             cp=sizes.get("cp", 1), ep=sizes.get("ep", 1))
    for name, key, fixed, count in (("dense", "dp", ("pp", "tp"), dp["dense_replicas"]),
                                    ("expert", "expert_dp", ("pp", "ep", "tp"),
                                     dp["expert_dp"])):
        by_hand = [_group(r, world, sizes, fixed) for r in range(world)]
        assert sorted(map(sorted, lines[key])) == sorted(map(list, set(map(tuple, by_hand))))
        assert [list(g) for g in expected[name]] == by_hand
        assert {len(g) for g in by_hand} == {count}
    assert dp["course_dp"] == sizes.get("dp", 1)


def test_data_parallel_sizes_deepseek_v3_and_expert_tp():
    assert data_parallel_sizes(2048, pp=16, ep=64) == {
        "dp": 128, "dense_replicas": 128, "expert_dp": 2, "course_dp": 2}
    sizes = data_parallel_sizes(64, pp=2, tp=4, ep=8, expert_tp=1)  # ETP x EP x EDP x PP = 64
    assert (sizes["expert_dp"], sizes["dp"]) == (4, 8)
    assert data_parallel_sizes(64, pp=2, tp=4, cp=2, ep=4)["dense_replicas"] == 8
    # MoE parallel folding: 16 GPUs, attention TP 4 x DP 4, experts EP 8 x ETP 1 x EDP 2 (EP
    # folded over TP as well as DP): a valid Megatron-Core layout, not this course's grid
    folded = data_parallel_sizes(16, tp=4, ep=8, expert_tp=1)
    assert folded == {"dp": 4, "dense_replicas": 4, "expert_dp": 2, "course_dp": None}
    assert data_parallel_sizes(32, tp=2, cp=2, ep=16, expert_tp=1)["expert_dp"] == 2  # over CP
    with pytest.raises(ValueError, match="EP × ETP = 12 must divide world/pp"):
        data_parallel_sizes(16, tp=4, ep=3)
    with pytest.raises(ValueError, match="does not divide world"):
        data_parallel_sizes(12, pp=5)


def test_expert_rows_with_and_without_capacity():
    loads = [7, 0, 3, 2]
    assert expert_rows(loads, capacity=None) == {"computed": 12, "padding": 0, "dropped": 0,
                                                 "largest": 7}
    # c = 3: kept 3 + 0 + 3 + 2 = 8 of 12, 4 x 3 = 12 slots, 4 empty
    assert expert_rows(loads, capacity=3) == {"computed": 12, "padding": 4, "dropped": 4,
                                              "largest": 3}
    with pytest.raises(ValueError):
        expert_rows([1, -1], capacity=None)


def _dense_block_loss(w, x, r):
    """The check's block with its MoE written densely: every expert on every token."""
    h = (x @ w["w_in"].t()).reshape(-1, x.shape[-1])  # (N, C)
    probs = torch.softmax(h @ w["router"].t(), dim=-1)  # (N, E)
    top = probs.topk(moe_grads.K, dim=-1)
    weight = torch.zeros_like(probs).scatter(1, top.indices, top.values)  # (N, E)
    outs = torch.stack([F.gelu(h @ w["w1"][e]) @ w["w2"][e]
                        for e in range(moe_grads.E)], dim=1)  # (N, E, C)
    y = h + (weight.unsqueeze(-1) * outs).sum(1) + F.gelu(h @ w["shared_w1"]) @ w["shared_w2"]
    return ((y @ w["w_out"].t()) * r.reshape(-1, r.shape[-1])).sum(-1).mean()


def _one_device(sizes):
    w = {k: v.clone().requires_grad_() for k, v in moe_grads.weights(sizes).items()
         if k not in ("x", "r")}
    data = moe_grads.weights(sizes)
    _dense_block_loss(w, data["x"], data["r"]).backward()
    return {k: v.grad for k, v in w.items()}


def _reference_worker(sizes):
    """parlab's own pieces on ranks: ep_moe over the grid's EP group, make_grid's dp and
    expert_dp, sum_grads with Megatron's expert scaling."""
    from torch import nn

    from parlab.compose import make_grid, sum_grads
    from parlab.moe import ExpertShard, ep_moe

    grid = make_grid(**sizes)
    d, e, c = (sizes.get(a, 1) for a in ("dp", "ep", "cp"))
    w = {k: v.to(launch.device()) for k, v in moe_grads.weights(sizes).items()}
    replica = grid.coords["dp"] * e + grid.coords["ep"]
    rows = slice(replica * moe_grads.B_REPLICA, (replica + 1) * moe_grads.B_REPLICA)
    cols = slice(grid.coords["cp"] * moe_grads.T_RANK, (grid.coords["cp"] + 1) * moe_grads.T_RANK)
    shard = ExpertShard(moe_grads._single_moe(w), grid.coords["ep"], e)
    params = {n: nn.Parameter(w[n].clone()) for n in moe_grads.DENSE}
    params.update({n: getattr(shard, n) for n in moe_grads.EXPERT})
    loss = moe_grads._block(params, w["x"][rows, cols], w["r"][rows, cols],
                            lambda h, g, ex: ep_moe(h, g, ex, shard, group=grid.ep))
    loss.backward()
    empty = [params[n].grad is None for n in moe_grads.EXPERT]
    sum_grads([params[n] for n in moe_grads.DENSE], group=grid.dp, scale=1 / (d * e * c))
    sum_grads([params[n] for n in moe_grads.EXPERT], group=grid.expert_dp,
              scale=1 / (d * e * c))
    return {"grads": {n: p.grad.cpu() for n, p in params.items()}, "first": shard.first,
            "empty": empty}


@pytest.mark.parametrize("sizes", [{"dp": 2, "ep": 2}, {"dp": 2, "ep": 2, "cp": 2}],
                         ids=["dp2-ep2", "dp2-ep2-cp2"])
def test_reference_reduction_matches_one_device(sizes):
    single = _one_device(sizes)
    check_ref = moe_grads.reference_grads(sizes)  # the check's own reference agrees
    for name, g in single.items():
        torch.testing.assert_close(check_ref[name], g, rtol=1e-9, atol=1e-12)
    world = 1
    for n in sizes.values():
        world *= n
    results = launch.run(_reference_worker, world, sizes)
    local = moe_grads.E // sizes["ep"]
    for rank, res in enumerate(results):
        assert res["empty"] == [rank == 0] * len(moe_grads.EXPERT)  # rank 0's experts idle
        for name, g in res["grads"].items():
            want = single[name] if name in moe_grads.DENSE else \
                single[name][res["first"]:res["first"] + local]
            torch.testing.assert_close(g, want, rtol=1e-9, atol=1e-12)


@pytest.mark.parametrize("world,sizes", GRIDS[:5], ids=[str(s) for _, s in GRIDS[:5]])
def test_every_likely_wrong_grouping_fails_with_its_hint(world, sizes):
    right = moe_groups.expected_members(world, sizes)
    found = [[{n: list(right[n][r]) for n in moe_groups.NAMES}] for r in range(world)]
    moe_groups._compare(found, world, [sizes])  # the right groups pass
    for name, cases in moe_groups.mistaken_members(world, sizes).items():
        for key, members in cases:
            if list(members) == list(right[name]):
                continue  # this mistake is right on this grid (cp forgotten where cp = 1)
            wrong = [[{**f[0], name: list(members[r])}] for r, f in enumerate(found)]
            with pytest.raises(CheckFailed) as info:
                moe_groups._compare(wrong, world, [sizes])
            first = next(k for k, m in cases if list(m) == list(members))
            assert moe_groups.HINTS[first] in str(info.value), (name, key)
