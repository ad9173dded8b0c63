"""parlab.moe, parlab.moe.dispatch and parlab.moe.costs: the reference MoE and its EP layer.

References are independent of the code under test: closed forms written out here (the balance
loss of an even and of a collapsed router, capacities, the keep mask of a hand-worked routing,
all-to-all bytes, the chance a node holds none of a token's experts), a choice-major loop for
the keep mask, and a dense single-device MoE that runs every expert on every token and masks
the results (float64, rtol 1e-10).
"""

from __future__ import annotations

import math
import sys

import cloudpickle
import pytest
import torch
import torch.distributed as dist
import torch.nn.functional as F

from parlab import comm, moe
from parlab.launch import run
from parlab.moe import ExpertShard, ep_moe, ep_moe_capacity, owner
from parlab.moe import costs as moe_costs

cloudpickle.register_pickle_by_value(sys.modules[__name__])  # ranks need not import this file
pytestmark = pytest.mark.usefixtures("no_orphans")
F64 = {"rtol": 1e-10, "atol": 1e-12}
N, C, FFN, K = 6, 8, 12, 2


def _loop_keep(experts: torch.Tensor, e: int, cap: int) -> torch.Tensor:
    seen = [0] * e
    keep = torch.zeros_like(experts, dtype=torch.bool)
    for j in range(experts.shape[1]):  # choice first
        for i in range(experts.shape[0]):  # then token
            ex = int(experts[i, j])
            keep[i, j], seen[ex] = seen[ex] < cap, seen[ex] + 1
    return keep


def _dense(layer: moe.MoE, x: torch.Tensor, gates: torch.Tensor, experts: torch.Tensor,
           keep: torch.Tensor) -> torch.Tensor:
    """Every expert on every token, weighted by a (N, E) matrix of kept gates."""
    all_out = torch.stack([F.gelu(x @ layer.w1[e]) @ layer.w2[e]
                           for e in range(layer.num_experts)], dim=1)  # (N, E, C)
    weight = torch.zeros(x.shape[0], layer.num_experts, dtype=x.dtype)
    weight = weight.scatter_add(1, experts, gates * keep)
    return x + (weight.unsqueeze(-1) * all_out).sum(dim=1)


def test_balance_loss_closed_forms():
    probs = torch.full((8, 4), 0.25, dtype=torch.float64)  # P_e = 1/E whatever f is
    experts = torch.tensor([[0, 1]] * 8)
    assert moe.balance_loss(probs, experts, num_experts=4).item() == pytest.approx(1.0)
    collapsed = torch.zeros(8, 4, dtype=torch.float64)
    collapsed[:, 2] = 1.0
    assert moe.balance_loss(collapsed, torch.full((8, 1), 2), num_experts=4).item() == 4.0
    # f = (3/4, 1/4, 0, 0) of k=1 choices; P = (0.5, 0.3, 0.1, 0.1): 4 (3/8 + 3/40) = 1.8
    p = torch.tensor([[0.5, 0.3, 0.1, 0.1]] * 4, dtype=torch.float64)
    got = moe.balance_loss(p, torch.tensor([[0], [0], [0], [1]]), num_experts=4)
    assert got.item() == pytest.approx(1.8)


def test_balance_loss_is_at_most_e_over_k():
    # top-2 collapsed onto experts 1 and 3 of E = 4: f = (0, 1/2, 0, 1/2); with all the
    # probability on those two, E * sum f P = 4 * 1/2 * 1 = 2 = E/k (E only for k = 1)
    probs = torch.tensor([[0.0, 0.7, 0.0, 0.3]] * 6, dtype=torch.float64)
    experts = torch.tensor([[1, 3]] * 6)
    assert moe.balance_loss(probs, experts, num_experts=4).item() == pytest.approx(4 / 2)
    g = torch.Generator().manual_seed(1)
    for _ in range(20):  # any routing and probabilities stay at or below E/k
        p = torch.softmax(torch.randn(10, 8, generator=g, dtype=torch.float64) * 5, dim=-1)
        ex = p.topk(3, dim=-1).indices
        assert moe.balance_loss(p, ex, num_experts=8).item() <= 8 / 3 + 1e-12


def test_route_is_top_k_of_softmax():
    x = torch.tensor([[1.0, 0.0], [0.0, 1.0]], dtype=torch.float64)
    w = torch.tensor([[2.0, 0.0], [0.0, 3.0], [1.0, 1.0]], dtype=torch.float64)
    gates, experts, probs = moe.route(x, w, k=2)
    z = 1 + math.exp(2) + math.e  # token 0: logits (2, 0, 1)
    assert experts.tolist() == [[0, 2], [1, 2]]
    assert gates[0].tolist() == pytest.approx([math.exp(2) / z, math.e / z])
    assert probs.sum(dim=1).tolist() == pytest.approx([1.0, 1.0])


@pytest.mark.parametrize("n, e, k, phi, want", [(6, 4, 2, 1.0, 3), (8, 4, 2, 1.25, 5),
                                               (10, 4, 1, 1.1, 3), (16, 8, 2, 0.5, 2),
                                               (12, 8, 2, 2.0, 6)])
def test_expert_capacity(n, e, k, phi, want):
    assert moe.expert_capacity(n, num_experts=e, k=k, capacity_factor=phi) == want


def test_keep_mask_worked_example_and_loop():
    worked = torch.tensor([[0, 1], [0, 2], [0, 1], [1, 0], [2, 0], [0, 3]])
    want = [[1, 1], [1, 1], [1, 1], [1, 0], [1, 0], [0, 1]]  # worked by hand, capacity 3
    assert moe.keep_mask(worked, num_experts=4, capacity=3).int().tolist() == want
    g = torch.Generator().manual_seed(0)
    for n, e, k, cap in ((20, 4, 2, 5), (30, 8, 3, 4), (9, 4, 1, 2)):
        ex = torch.stack([torch.randperm(e, generator=g)[:k] for _ in range(n)])
        ex[: n // 2, 0] = 1
        assert torch.equal(moe.keep_mask(ex, num_experts=e, capacity=cap), _loop_keep(ex, e, cap))
    stats = moe.load_stats(worked, num_experts=4, capacity_factor=1.0)
    assert (stats.capacity, stats.offered, stats.kept) == (3, [6, 3, 2, 1], [3, 3, 2, 1])
    assert (stats.dropped_assignments, stats.dropped_tokens) == (3, 0)


@pytest.mark.parametrize("phi", [None, 0.5, 1.0])
def test_reference_matches_dense(phi):
    torch.manual_seed(3)
    layer = moe.MoE(C, FFN, 4, k=K).double()
    x = torch.randn(12, C, dtype=torch.float64)
    gates, experts, _ = moe.route(x, layer.router, k=K)
    keep = torch.ones_like(experts, dtype=torch.bool)
    if phi is not None:
        cap = math.ceil(phi * 6 * K / 4)
        keep = torch.cat([_loop_keep(experts[:6], 4, cap), _loop_keep(experts[6:], 4, cap)])
    got = layer(x, capacity_factor=phi, groups=2)
    torch.testing.assert_close(got, _dense(layer, x, gates, experts, keep), **F64)


def test_bias_update_moves_against_the_load():
    b = moe.bias_update(torch.zeros(4), torch.tensor([[0], [0], [0], [1]]), num_experts=4,
                        rate=0.5)
    assert b.tolist() == [-0.5, 0.0, 0.5, 0.5]  # mean load 1: expert 0 down, 2 and 3 up


def _ep_worker(phi, per_rank):
    rank, ep = dist.get_rank(), dist.get_world_size()
    e = per_rank * ep
    torch.manual_seed(11)
    layer = moe.MoE(C, FFN, e, k=K).double()
    x = torch.randn(N * ep, C, dtype=torch.float64)
    x[:, 0] = 1.0
    with torch.no_grad():
        layer.router[0, 0] = 2.0  # skewed: drops at phi = 1
    gates, experts, _ = moe.route(x, layer.router.detach(), k=K)
    rows = slice(rank * N, (rank + 1) * N)
    xs, gs = x[rows].clone().requires_grad_(), gates[rows].clone().requires_grad_()
    shard = ExpertShard(layer, rank, ep)
    with comm.trace() as tr:
        if phi is None:
            y = ep_moe(xs, gs, experts[rows], shard)
        else:
            cap = math.ceil(phi * N * K / e)
            y = ep_moe_capacity(xs, gs, experts[rows], shard, capacity=cap)
    y.pow(2).sum().backward()
    keep = torch.ones_like(experts, dtype=torch.bool)
    if phi is not None:
        keep = torch.cat([_loop_keep(experts[q * N:(q + 1) * N], e, cap) for q in range(ep)])
    xr, gr = x.clone().requires_grad_(), gates.clone().requires_grad_()
    ref = _dense(layer, xr, gr, experts, keep)
    ref.pow(2).sum().backward()
    torch.testing.assert_close(y, ref[rows], **F64)
    torch.testing.assert_close(xs.grad, xr.grad[rows], **F64)
    torch.testing.assert_close(gs.grad, gr.grad[rows], **F64)
    local = slice(shard.first, shard.first + shard.local)
    torch.testing.assert_close(shard.w1.grad, layer.w1.grad[local], **F64)
    torch.testing.assert_close(shard.w2.grad, layer.w2.grad[local], **F64)
    floats = [e for e in tr.events if e.dtype == "float64"]
    return [e.shape for e in floats], sum(e.wire_bytes for e in floats), int((~keep).sum())


@pytest.mark.parametrize("ep, per_rank, phi", [(2, 2, None), (4, 2, None), (3, 3, None),
                                                (2, 2, 1.0), (4, 2, 1.0), (3, 3, 1.25)])
def test_ep_layer_matches_single_device(ep, per_rank, phi):
    results = run(_ep_worker, ep, phi, per_rank, timeout=60)
    if phi is None:
        assert all(len(shapes) == 2 for shapes, _, _ in results)  # dispatch, combine
        return
    e = per_rank * ep
    cap = math.ceil(phi * N * K / e)  # 1.25 * 12 / 9 = 1.67: a capacity that is not whole
    assert sum(r[2] for r in results) > 0, "the skewed router should drop something"
    for shapes, wire, _ in results:
        assert shapes == [(e * cap, C)] * 2  # static buffers
        assert wire == 2 * (ep - 1) / ep * e * cap * C * 8  # closed form, float64
        assert wire == moe_costs.ep_a2a_bytes(N, C, ep, num_experts=e, k=K,
                                              capacity_factor=phi, dtype_bytes=8)


def test_owner_is_block_placement():
    assert [owner(e, num_experts=8, ep=4) for e in range(8)] == [0, 0, 1, 1, 2, 2, 3, 3]
    assert [owner(e, num_experts=9, ep=3) for e in range(9)] == [0, 0, 0, 1, 1, 1, 2, 2, 2]


def test_a2a_cost_closed_forms():
    # E = 4 over 2 nodes, k = 2: a node holds none of a token's experts with q = 1/6
    assert moe_costs.uniform_remote_nodes(4, 2, 2) == pytest.approx(5 / 6)
    assert moe_costs.uniform_remote_nodes(8, 1, 4) == pytest.approx(3 / 4)  # k = 1: (G-1)/G
    r = moe_costs.a2a_cost(100, 10, k=2, num_experts=4, nodes=2, gpus_per_node=2,
                           dtype_bytes=1, intra_bw=1.0, inter_bw=1.0, alpha=0.0)
    assert r["flat"]["inter_bytes"] == 100 * 2 * 2 / 4 * 10  # N k (t - g) / t rows of h d
    assert r["flat"]["intra_bytes"] == 100 * 2 * 1 / 4 * 10
    assert r["hierarchical"]["inter_bytes"] == pytest.approx(100 * 5 / 6 * 10)
    assert r["flat"]["messages"] == 3 and r["hierarchical"]["messages"] == 1 + 2
