"""parlab.dp.fsdp and parlab.costs.memory against independent references: a DDP step in plain torch,
closed forms written here, and subsets tried by hand."""

from __future__ import annotations

import copy
import itertools

import pytest
import torch
import torch.distributed as dist
from torch import nn

from parlab.costs import memory
from parlab.dp import plan_reshard, reshard_bytes, shard_bounds
from parlab.launch import run

pytestmark = pytest.mark.usefixtures("no_orphans")


def _fsdp_step(reshard: bool, out_f: int, in_f: int) -> dict:
    from parlab import comm
    from parlab.dp import FSDPLinear

    rank, t = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(0)
    linear = nn.Linear(in_f, out_f)
    xs = [torch.randn(3, in_f, generator=torch.Generator().manual_seed(q)) for q in range(t)]
    layer = FSDPLinear.from_linear(copy.deepcopy(linear), reshard_after_forward=reshard)
    with comm.trace() as tr:
        y = layer(xs[rank])
        y.square().sum().backward()
    torch.optim.SGD(layer.parameters(), lr=0.1).step()
    return {"y": y.detach(), "shard": layer.shard.detach().clone(), "sent": tr.wire_bytes()}


@pytest.mark.parametrize("t, reshard", [(2, True), (4, True), (2, False)])
def test_fsdp_step_equals_ddp_and_sends_3p(t, reshard):
    out_f, in_f = 8, 8
    got = run(_fsdp_step, t, reshard, out_f, in_f)
    torch.manual_seed(0)
    ref = nn.Linear(in_f, out_f)
    xs = [torch.randn(3, in_f, generator=torch.Generator().manual_seed(q)) for q in range(t)]
    ys = [ref(x) for x in xs]
    (sum(y.square().sum() for y in ys) / t).backward()  # DDP: the mean of the ranks' grads
    with torch.no_grad():
        flat = torch.cat([ref.weight.flatten(), ref.bias]) - 0.1 * torch.cat(
            [ref.weight.grad.flatten(), ref.bias.grad])
    p, n = out_f * in_f + out_f, (out_f * in_f + out_f) // t
    passes = 3 if reshard else 2
    for rank, res in enumerate(got):
        torch.testing.assert_close(res["y"], ys[rank].detach(), rtol=1e-5, atol=1e-6)
        torch.testing.assert_close(res["shard"], flat[rank * n:(rank + 1) * n],
                                   rtol=1e-5, atol=1e-6)
        assert res["sent"] == pytest.approx(passes * (t - 1) / t * p * 4)


def test_padding_when_p_is_not_a_multiple_of_t():
    assert shard_bounds(54, 3, 4) == (42, 56)  # ceil(54/4) = 14
    got = run(_fsdp_step, 4, True, 6, 8)  # P = 54: padded to 56
    assert got[0]["sent"] == pytest.approx(3 * 3 / 4 * 56 * 4)


def test_plan_reshard_is_the_best_subset():
    sizes, budget, t = [9.0, 7.0, 6.0, 4.0, 2.0], 12.0, 8
    plan = plan_reshard(sizes, budget)
    best = min(reshard_bytes(sizes, list(c), t)["moved"]
               for c in itertools.product((True, False), repeat=5)
               if sum(s for s, r in zip(sizes, c, strict=True) if not r) <= budget)
    cost = reshard_bytes(sizes, plan, t)
    assert cost["peak"] <= budget and cost["moved"] == pytest.approx(best)
    assert cost["moved"] == pytest.approx((3 * 28 - 12) * 7 / 8)  # 12 of 28 kept
    assert plan_reshard([1.0, 1.0], 0.0) == [True, True]


@pytest.mark.parametrize("strategy, parts", [
    ("ddp", (2, 2, 12)), ("zero1", (2, 2, 12 / 8)), ("zero2", (2, 2 / 8, 12 / 8)),
    ("zero3", (2 / 8, 2 / 8, 12 / 8)), ("fsdp", (2 / 8, 2 / 8, 12 / 8))])
def test_state_breakdown(strategy, parts):
    got = memory.state_breakdown(1e9, strategy, 8)
    assert [got[k] for k in ("weights", "gradients", "optimizer state")] == pytest.approx(
        [x * 1e9 for x in parts])


def test_activations_with_and_without_recompute():
    b, s, h, a, L = 1, 1024, 2048, 16, 4
    per_layer = s * b * h * (34 + 5 * a * s / h)
    assert memory.activation_bytes(L, h, s, b, heads=a) == pytest.approx(L * per_layer)
    assert memory.activation_bytes(L, h, s, b, heads=a, recompute=True) == pytest.approx(
        L * 2 * s * b * h + per_layer)


def test_selective_recomputation_keeps_34_sbh_per_layer():
    b, s, h, a, L = 1, 4096, 8192, 64, 80
    sbh = s * b * h
    selective = memory.activation_bytes(L, h, s, b, heads=a, recompute="selective")
    assert selective == pytest.approx(L * 34 * sbh)  # the 5as/h scores term recomputed
    none = memory.activation_bytes(L, h, s, b, heads=a, recompute="none")
    assert none == memory.activation_bytes(L, h, s, b, heads=a) == pytest.approx(
        L * sbh * (34 + 5 * a * s / h))
    assert memory.activation_bytes(L, h, s, b, heads=a, recompute="full") == \
        memory.activation_bytes(L, h, s, b, heads=a, recompute=True)
    with pytest.raises(ValueError, match="selective"):
        memory.activation_bytes(L, h, s, b, heads=a, recompute="some")
