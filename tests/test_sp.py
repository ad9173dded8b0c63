"""parlab.sp, parlab.tp.block and parlab.costs.activations: the reference sequence-parallel code.

References are independent of the code under test: closed forms written out here (position-
tagged inputs whose all-gather, reduce-scatter and their gradients are known in advance; the
bytes of the ring collectives; Korthikanti et al.'s activation formulas; the bytes autograd
saves for a LayerNorm, a bool mask, a product) and the single-device layer built from the same
seeded weights (float32, rtol 1e-5, atol 1e-6: only the summation order differs, ~1e-7).
"""

from __future__ import annotations

import copy
import sys

import cloudpickle
import pytest
import torch
import torch.distributed as dist
from torch import nn

from parlab import comm, costs
from parlab import tp as sp
from parlab.costs import activations
from parlab.launch import run
from parlab.tp import DropoutBlock, SPBlock

cloudpickle.register_pickle_by_value(sys.modules[__name__])  # ranks need not import this file
pytestmark = pytest.mark.usefixtures("no_orphans")
F32 = {"rtol": 1e-5, "atol": 1e-6}
B, S, H, HEADS, P = 2, 8, 16, 4, 0.25


def _positions(t: int, rows: int = 3) -> torch.Tensor:
    """(2, rows * t, 4) float64 holding each token's position s along dim 1."""
    return torch.arange(rows * t, dtype=torch.float64).view(1, -1, 1).expand(2, -1, 4).clone()


def _mine(x: torch.Tensor, rank: int, t: int) -> torch.Tensor:
    n = x.shape[1] // t
    return x[:, rank * n:(rank + 1) * n]


# --- the operators -------------------------------------------------------------------------------

def _operator_worker() -> dict:
    rank, t = dist.get_rank(), dist.get_world_size()
    s = _positions(t)
    weighted = (rank + 1) * (s + 1)  # (B, T, C), different on every rank
    out = {}
    cases = {
        "gather": (sp.gather_from_sequence_parallel_region, _mine(s, rank, t), weighted),
        "gather_replicated_grad": (
            lambda x: sp.gather_from_sequence_parallel_region(x, tensor_parallel_output_grad=False),
            _mine(s, rank, t), weighted),
        "reduce_scatter": (sp.reduce_scatter_to_sequence_parallel_region, weighted,
                           _mine(s, rank, t)),
        "scatter": (sp.scatter_to_sequence_parallel_region, s, _mine(s, rank, t)),
    }
    for name, (op, x0, up) in cases.items():
        x = x0.clone().requires_grad_()
        with comm.trace() as fwd:
            y = op(x)
        with comm.trace() as bwd:
            y.backward(up)
        out[name] = (y.detach(), x.grad, [e.kind for e in fwd.events],
                     [e.kind for e in bwd.events], fwd.wire_bytes() + bwd.wire_bytes())
    return out


@pytest.mark.parametrize("t", [2, 4])
def test_operators_exact_with_position_tagged_inputs(t):
    s = _positions(t)
    s1 = t * (t + 1) / 2  # sum over ranks q of (q + 1)
    n_bytes = s.numel() * 8  # the whole (B, T, C) float64 tensor
    for rank, res in enumerate(run(_operator_worker, t)):
        y, grad, fwd, bwd, sent = res["gather"]
        assert torch.equal(y, s) and torch.equal(grad, _mine(s1 * (s + 1), rank, t))
        assert (fwd, bwd) == (["all_gather"], ["reduce_scatter"])
        assert sent == 2 * (t - 1) / t * n_bytes  # (t-1)/t n each way: one all-reduce's worth
        y, grad, fwd, bwd, _ = res["gather_replicated_grad"]
        assert torch.equal(grad, _mine((rank + 1) * (s + 1), rank, t)) and bwd == []
        y, grad, fwd, bwd, _ = res["reduce_scatter"]
        assert torch.equal(y, _mine(s1 * (s + 1), rank, t)) and torch.equal(grad, s)
        assert (fwd, bwd) == (["reduce_scatter"], ["all_gather"])
        y, grad, fwd, bwd, _ = res["scatter"]
        assert torch.equal(y, _mine(s, rank, t)) and (fwd, bwd) == ([], ["all_gather"])
        assert torch.equal(grad, s)  # every rank's own rows of s, gathered


def test_operators_are_the_identity_without_torch_distributed():
    assert not dist.is_initialized()
    x = torch.randn(2, 6, 4, requires_grad=True)
    for op in (sp.gather_from_sequence_parallel_region,
               sp.reduce_scatter_to_sequence_parallel_region,
               sp.scatter_to_sequence_parallel_region):
        y = op(x)
        y.backward(torch.ones_like(y))
        assert torch.equal(y, x) and torch.equal(x.grad, torch.ones_like(x))
        x.grad = None


# --- dropout -----------------------------------------------------------------------------------

def _dropout_worker() -> dict:
    x = torch.ones(2, 4, 8, requires_grad=True)  # this rank's rows of a (2, 4t, 8) activation
    gen = torch.Generator().manual_seed(3)
    with activations.SavedTensorMeter() as meter:
        first = sp.sequence_parallel_dropout(x, p_drop=0.75, generator=gen)
    second = sp.sequence_parallel_dropout(x, p_drop=0.75, generator=gen)
    again = sp.sequence_parallel_dropout(x, p_drop=0.75,
                                         generator=torch.Generator().manual_seed(3))
    return first.detach(), second.detach(), again.detach(), meter.total


@pytest.mark.parametrize("t", [2, 4])
def test_dropout_shards_are_rows_of_the_single_device_masks(t):
    gen = torch.Generator().manual_seed(3)
    # p_drop = 0.75: kept values are scaled by 1/(1 - p_drop) = 4, not 1/p_drop = 4/3 (at 0.5
    # the two would agree)
    whole = [(torch.rand(2, 4 * t, 8, generator=gen) >= 0.75) * 4.0 for _ in range(2)]
    results = run(_dropout_worker, t)
    for rank, (first, second, again, saved) in enumerate(results):
        assert torch.equal(first, _mine(whole[0], rank, t))
        assert torch.equal(second, _mine(whole[1], rank, t))  # the next draw of the generator
        assert torch.equal(again, first)
        assert saved == 2 * 4 * 8  # a bool mask of its own rows, 1 B each: not the whole mask
    assert not all(torch.equal(r[0], results[0][0]) for r in results)  # the shards differ


def test_dropout_keep_mask_refuses_a_bad_probability():
    with pytest.raises(ValueError, match="p_drop must be a probability"):
        sp.dropout_keep_mask((2,), p_drop=1.0, generator=torch.Generator())


# --- the layer -----------------------------------------------------------------------------------

def _layer_worker(sequence_parallel: bool, groups: list[list[int]] | None = None,
                  regather: bool = False) -> dict:
    rank = dist.get_rank()
    group = None
    if groups:  # every rank creates every group, in the same order
        made = [dist.new_group(g) for g in groups]
        group = next(m for m, g in zip(made, groups, strict=True) if rank in g)
    r, t = dist.get_rank(group), dist.get_world_size(group)
    torch.manual_seed(5)
    block = DropoutBlock(H, HEADS, p_drop=P)
    x, up = torch.randn(B, S, H), torch.randn(B, S, H)
    xr = x.clone().requires_grad_()
    (block(xr, torch.Generator().manual_seed(9)) * up).sum().backward()
    ref = {n: p.grad.clone() for n, p in block.named_parameters()}
    layer = SPBlock.from_block(copy.deepcopy(block), group=group,
                               sequence_parallel=sequence_parallel, regather=regather)
    xin = (_mine(x, r, t) if sequence_parallel else x).clone().requires_grad_()
    upstream = _mine(up, r, t) if sequence_parallel else up
    with comm.trace() as fwd:
        y = layer(xin, torch.Generator().manual_seed(9))
    with comm.trace() as bwd:
        (y * upstream).sum().backward()
    with comm.trace() as sync:
        layer.allreduce_sequence_parallel_grads()
    with torch.no_grad():
        ref_y = block(x, torch.Generator().manual_seed(9))
    return {"y": y.detach(), "ref_y": ref_y, "x.grad": xin.grad, "ref_x.grad": xr.grad,
            "grads": {n: p.grad for n, p in layer.named_parameters()}, "ref": ref,
            "fwd": [e.kind for e in fwd.events], "bwd": [e.kind for e in bwd.events],
            "sync": [(e.kind, e.shape) for e in sync.events], "r": r, "t": t,
            "bytes": fwd.wire_bytes() + bwd.wire_bytes(),
            "sizes": {e.group_size for e in fwd.events + bwd.events}}


def _expected_grad(res: dict, name: str) -> torch.Tensor:
    r, t, ref = res["r"], res["t"], res["ref"]
    full = {"qkv": "attn.qkv", "proj": "attn.proj", "fc1": "mlp.fc1", "fc2": "mlp.fc2"}
    module, _, kind = name.partition(".")
    g = ref[f"{full.get(module, module)}.{kind}"]
    if module == "qkv":  # heads first: rows [Q_r; K_r; V_r]
        c = H // t
        return g[torch.cat([torch.arange(j * H + r * c, j * H + (r + 1) * c) for j in range(3)])]
    if module == "fc1":
        return g.chunk(t, dim=0)[r]
    if module in ("proj", "fc2") and kind == "weight":
        return g.chunk(t, dim=1)[r]
    return g  # LayerNorms and the row-parallel biases: whole


@pytest.mark.parametrize("sequence_parallel", [True, False], ids=["tp_sp", "tp"])
@pytest.mark.parametrize("t", [2, 4])
def test_layer_matches_the_single_device_layer_with_dropout(t, sequence_parallel):
    pattern = ["all_gather", "reduce_scatter"] * 2 if sequence_parallel else ["all_reduce"] * 2
    for res in run(_layer_worker, t, sequence_parallel):
        rows = (lambda z, res=res: _mine(z, res["r"], t)) if sequence_parallel else (lambda z: z)
        torch.testing.assert_close(res["y"], rows(res["ref_y"]), **F32)
        torch.testing.assert_close(res["x.grad"], rows(res["ref_x.grad"]), **F32)
        assert len(res["grads"]) == 12
        for name, grad in res["grads"].items():
            torch.testing.assert_close(grad, _expected_grad(res, name), **F32, msg=name)
        assert res["fwd"] == res["bwd"] == pattern
        # 4 x 2(t-1)/t * bsh * 4 B, written out: the same for TP and TP + SP
        assert res["bytes"] == 4 * 2 * (t - 1) / t * B * S * H * 4
        assert res["bytes"] == costs.tp_bytes_per_layer(B, S, H, t, dtype_bytes=4)
        # one all-reduce of the 4H LayerNorm and 2H bias elements under SP, nothing under TP
        assert res["sync"] == ([("all_reduce", (6 * H,))] if sequence_parallel else [])


@pytest.mark.parametrize("t", [2, 4])
def test_layer_that_gathers_its_input_again_in_backward(t):
    """SPBlock(regather=True), Megatron's: the same outputs and gradients as one device; in
    backward each GEMM entered by an all-gather gathers its input again, so a layer sends
    6 all-gathers and 4 reduce-scatters, 10 (t-1)/t bsh elements instead of 8."""
    for res in run(_layer_worker, t, True, None, True):
        torch.testing.assert_close(res["y"], _mine(res["ref_y"], res["r"], t), **F32)
        torch.testing.assert_close(res["x.grad"], _mine(res["ref_x.grad"], res["r"], t), **F32)
        for name, grad in res["grads"].items():
            torch.testing.assert_close(grad, _expected_grad(res, name), **F32, msg=name)
        assert res["fwd"] == ["all_gather", "reduce_scatter"] * 2
        # MLP first: the gradient gathered into fc2's backward, fc1's input gathered again,
        # fc1's input gradient reduce-scattered; then the same for attention
        assert res["bwd"] == ["all_gather", "all_gather", "reduce_scatter"] * 2
        assert res["bytes"] == 10 * (t - 1) / t * B * S * H * 4
        assert res["bytes"] == pytest.approx(
            sum(sp.sp_bytes_per_layer(B, S, H, t, dtype_bytes=4, regather=True).values()))


def test_layer_in_two_tp_groups_of_two():
    """World of 4 = groups {0, 1} and {2, 3}: every collective, dropout rows included, stays
    within its group."""
    for res in run(_layer_worker, 4, True, [[0, 1], [2, 3]]):
        torch.testing.assert_close(res["y"], _mine(res["ref_y"], res["r"], 2), **F32)
        for name, grad in res["grads"].items():
            torch.testing.assert_close(grad, _expected_grad(res, name), **F32, msg=name)
        assert res["sizes"] == {2}


def test_sp_bytes_per_layer_by_hand():
    # practice problem: b = 1, s = h = 8192, bf16, t = 8: 4 x 7/8 x 2^27 B per kind
    assert sp.sp_bytes_per_layer(1, 8192, 8192, 8) == {"all_gather": 4 * 7 / 8 * 2**27,
                                                       "reduce_scatter": 4 * 7 / 8 * 2**27}
    for b, s, h, t, d in ((2, 8, 16, 2, 4), (4, 2048, 4096, 4, 2), (1, 64, 64, 1, 2)):
        split = sp.sp_bytes_per_layer(b, s, h, t, dtype_bytes=d)
        assert split["all_gather"] == split["reduce_scatter"] == 4 * (t - 1) / t * b * s * h * d
        assert sum(split.values()) == costs.tp_bytes_per_layer(b, s, h, t, dtype_bytes=d)
        again = sp.sp_bytes_per_layer(b, s, h, t, dtype_bytes=d, regather=True)
        assert again == {"all_gather": 6 * (t - 1) / t * b * s * h * d,
                         "reduce_scatter": 4 * (t - 1) / t * b * s * h * d}


# --- activation memory: formulas and the meter ---------------------------------------------------

@pytest.mark.parametrize("b, s, h, a, t", [(1, 2048, 12288, 96, 8), (4, 512, 1024, 16, 2),
                                           (2, 4096, 4096, 32, 4)])
def test_korthikanti_closed_forms(b, s, h, a, t):
    sbh = s * b * h
    assert activations.activation_bytes_per_layer(b, s, h, a) == sbh * (34 + 5 * a * s / h)
    assert activations.activation_bytes_per_layer(b, s, h, a, t) == pytest.approx(
        sbh * (10 + 24 / t + 5 * a * s / (h * t)))
    assert activations.activation_bytes_per_layer(b, s, h, a, t, sp=True) == pytest.approx(
        sbh / t * (34 + 5 * a * s / h))
    tp = activations.activation_breakdown(b, s, h, a, t)
    assert sum(v for k, v in tp.items() if not activations.REGIONS[k][1]) == 10 * sbh


def test_gpt3_layer_by_hand():
    """s = 2048, h = 12288, a = 96, b = 1: sbh = 3 * 2^23, 5as/h = 80; per layer one device
    114 sbh, TP (t = 8) 23 sbh, TP + SP 114/8 sbh."""
    sbh = 3 * 2**23
    assert activations.activation_bytes_per_layer(1, 2048, 12288, 96) == 114 * sbh
    assert activations.activation_bytes_per_layer(1, 2048, 12288, 96, 8) == 23 * sbh
    assert activations.activation_bytes_per_layer(1, 2048, 12288, 96, 8, sp=True) == 114 * sbh / 8



def test_recomputed_scores_leave_34_sbh():
    """keep_scores=False drops the 5as/h terms: 34 sbh, sbh (10 + 24/t) and 34 sbh / t, i.e.
    13 sbh and 4.25 sbh at t = 8 (module 03's quick question)."""
    b, s, h, a = 1, 2048, 12288, 96
    sbh = s * b * h
    assert activations.activation_bytes_per_layer(b, s, h, a, keep_scores=False) == 34 * sbh
    assert activations.activation_bytes_per_layer(b, s, h, a, 8, keep_scores=False) == 13 * sbh
    assert activations.activation_bytes_per_layer(b, s, h, a, 8, sp=True,
                                                  keep_scores=False) == 4.25 * sbh
    parts = activations.activation_breakdown(b, s, h, a, 8, keep_scores=False)
    assert parts["attention scores (softmax, mask, dropout)"] == 0


def test_formulas_refuse_bad_sizes():
    with pytest.raises(ValueError, match="t must be a whole number >= 1"):
        activations.activation_bytes_per_layer(1, 2, 2, 1, 0)


def test_meter_counts_each_storage_once_and_skips_excluded():
    x = torch.randn(2, 8, 16, requires_grad=True)  # 1024 B
    ln = nn.LayerNorm(16)
    mask = torch.rand(2, 8, 16) > 0.5  # 256 B of bool
    with activations.SavedTensorMeter(exclude=ln.parameters()) as meter:
        with activations.region("square"):
            x * x  # saves x twice: one storage
        with activations.region("layernorm"):
            ln(x)  # x (already counted), mean and 1/std: 2 x 16 x 4 B each
        with activations.region("dropout"):
            x[:, :4] * mask[:, :4]  # a view of the mask: its whole storage
    assert meter.by_region == {"square": 1024, "layernorm": 2 * 2 * 8 * 4, "dropout": 256}
    assert activations.saved_tensor_bytes(lambda z: z.exp(), x.detach()) == 0


def _region_worker(sequence_parallel: bool, regather: bool = False) -> dict:
    rank, t = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(0)
    block = DropoutBlock(H, HEADS, p_drop=P)
    x = torch.randn(B, S, H)
    layer = SPBlock.from_block(block, sequence_parallel=sequence_parallel, regather=regather)
    xin = (_mine(x, rank, t) if sequence_parallel else x).clone().requires_grad_()
    with activations.SavedTensorMeter(exclude=layer.parameters()) as meter:
        layer(xin, torch.Generator().manual_seed(1))
    return meter.by_region


@pytest.mark.parametrize("t", [2, 4])
def test_measured_regions_of_a_layer(t):
    """float32: a LayerNorm saves its (b, s, h) input and a mean and 1/std per token; a dropout
    a bool mask; the gathered QKV and fc1 inputs stay (b, s, h) under TP + SP."""
    bsh, bs = B * S * H, B * S
    tp = run(_region_worker, t, False)[0]
    assert tp["LayerNorm"] == 2 * (4 * bsh + 2 * 4 * bs)
    assert tp["dropout"] == 2 * bsh
    assert tp["QKV and fc1 inputs"] == 2 * 4 * bsh
    for got in run(_region_worker, t, True):
        assert got["LayerNorm"] * t == tp["LayerNorm"]
        assert got["dropout"] * t == tp["dropout"]
        for name in ("QKV and fc1 inputs", "attention", "MLP"):
            assert got[name] == tp[name]
    # Megatron's way: only the shard of each LayerNorm output is kept, gathered in backward
    for got in run(_region_worker, t, True, True):
        assert got["QKV and fc1 inputs"] * t == tp["QKV and fc1 inputs"]
        assert got["LayerNorm"] * t == tp["LayerNorm"]
