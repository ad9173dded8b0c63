"""parlab.tp and parlab.tp_attention: the reference tensor-parallel layers.

Every parallel result is compared with the single-device module built from the same seeded
weights, on 2 and 4 ranks. Tolerances: float64 for the linear layers (rtol 1e-10: only the
summation order differs, ~1e-16), float32 for the MLP, attention and layer (rtol 1e-5,
atol 1e-6: a different summation order moves float32 by ~1e-7). f and g are checked exactly
with rank-valued inputs (rank r holds r, its upstream gradient is r + 1), and the bytes the
tracer counts over a layer against parlab.costs.tp_bytes_per_layer (float32: dtype_bytes=4).
PyTorch's own DTensor tensor parallelism is an independent reference for the MLP.
"""

from __future__ import annotations

import copy
import sys

import cloudpickle
import pytest
import torch
import torch.distributed as dist
from torch import nn

from parlab import comm, costs, tp
from parlab.launch import RankError, run
from parlab.model import MLP, Attention, Block
from parlab.tp import TPAttention, TPBlock, heads_first_qkv

cloudpickle.register_pickle_by_value(sys.modules[__name__])  # ranks need not import this file
pytestmark = pytest.mark.usefixtures("no_orphans")
F64 = {"rtol": 1e-10, "atol": 1e-12}
F32 = {"rtol": 1e-5, "atol": 1e-6}
B, S, H, HEADS = 2, 5, 16, 4


def _rank() -> tuple[int, int]:
    return dist.get_rank(), dist.get_world_size()


def _trace_step(module: nn.Module, x: torch.Tensor, up: torch.Tensor) -> dict:
    """Forward and backward of sum(module(x) * up), each traced; x gets a fresh grad."""
    x = x.detach().clone().requires_grad_()
    with comm.trace() as fwd:
        y = module(x)
    with comm.trace() as bwd:
        (y * up).sum().backward()
    return {"y": y.detach(), "x.grad": x.grad, "fwd": [(e.kind, e.shape) for e in fwd.events],
            "bwd": [(e.kind, e.shape) for e in bwd.events], "bytes": fwd.wire_bytes()
            + bwd.wire_bytes(), "group_sizes": {e.group_size for e in fwd.events + bwd.events}}


def _reference(module: nn.Module, x: torch.Tensor, up: torch.Tensor) -> dict:
    ref = _trace_step(module, x, up)
    ref.update({f"{n}.grad": p.grad.clone() for n, p in module.named_parameters()})
    module.zero_grad(set_to_none=True)
    return ref


# --- f, g and the other region operators -------------------------------------------------------

def _region_worker() -> dict:
    rank, t = _rank()
    out = {}
    for name, op in (("f", tp.copy_to_tp_region), ("g", tp.reduce_from_tp_region)):
        x = torch.full((3, 4), float(rank), dtype=torch.float64, requires_grad=True)
        with comm.trace() as fwd:
            y = op(x)
        with comm.trace() as bwd:
            y.backward(torch.full_like(y, rank + 1.0))
        out[name] = (y.detach(), x.grad, x.detach().clone(), [e.kind for e in fwd.events],
                     [e.kind for e in bwd.events])
    x = torch.arange(4 * t, dtype=torch.float64).reshape(2, 2 * t)  # the same on every rank
    piece = tp.scatter_to_tp_region(x.clone().requires_grad_())
    whole = tp.gather_from_tp_region(piece)
    out["scatter_gather"] = (piece.detach(), whole.detach(), x)
    return out


@pytest.mark.parametrize("t", [2, 4])
def test_f_and_g_exact_with_rank_valued_inputs(t):
    s0, s1 = t * (t - 1) / 2, t * (t + 1) / 2  # sum of ranks, sum of (rank + 1)
    for rank, res in enumerate(run(_region_worker, t)):
        y, grad, x_after, fwd, bwd = res["f"]
        assert torch.equal(y, torch.full((3, 4), float(rank), dtype=torch.float64))
        assert torch.equal(grad, torch.full((3, 4), s1, dtype=torch.float64))
        assert (fwd, bwd) == ([], ["all_reduce"])
        y, grad, x_after, fwd, bwd = res["g"]
        assert torch.equal(y, torch.full((3, 4), s0, dtype=torch.float64))
        assert torch.equal(grad, torch.full((3, 4), rank + 1.0, dtype=torch.float64))
        assert torch.equal(x_after, torch.full((3, 4), float(rank), dtype=torch.float64))
        assert (fwd, bwd) == (["all_reduce"], [])
        piece, whole, x = res["scatter_gather"]
        assert torch.equal(piece, x.chunk(t, dim=-1)[rank])
        assert torch.equal(whole, x)


def test_operators_are_the_identity_without_torch_distributed():
    assert not dist.is_initialized()
    x = torch.randn(3, 4, requires_grad=True)
    for op in (tp.copy_to_tp_region, tp.reduce_from_tp_region, tp.gather_from_tp_region,
               tp.scatter_to_tp_region):
        y = op(x)
        y.backward(torch.ones_like(y))
        assert torch.equal(y, x) and torch.equal(x.grad, torch.ones_like(x))
        x.grad = None
    torch.manual_seed(0)
    mlp = MLP(8)
    x = torch.randn(2, 8)
    assert torch.equal(tp.TPMLP.from_mlp(mlp)(x), mlp(x))  # t = 1: the very same GEMMs


# --- linear layers ----------------------------------------------------------------------------

def _linear_worker(kind: str, gather_output: bool, input_is_parallel: bool) -> dict:
    rank, t = _rank()
    gen = torch.Generator().manual_seed(7)
    k, n = (8, 12) if kind == "column" else (12, 8)
    full = nn.Linear(k, n, dtype=torch.float64)
    with torch.no_grad():
        full.weight.copy_(torch.randn(n, k, generator=gen, dtype=torch.float64))
        full.bias.copy_(torch.randn(n, generator=gen, dtype=torch.float64))
    x = torch.randn(B, 3, k, generator=gen, dtype=torch.float64)
    up = torch.randn(B, 3, n, generator=gen, dtype=torch.float64)
    ref = _reference(full, x, up)
    if kind == "column":
        layer = tp.ColumnParallelLinear.from_linear(full, gather_output=gather_output)
        block = slice(rank * n // t, (rank + 1) * n // t)
        upstream, xin = (up if gather_output else up[..., block]), x
    else:
        layer = tp.RowParallelLinear.from_linear(full, input_is_parallel=input_is_parallel)
        block = slice(rank * k // t, (rank + 1) * k // t)
        upstream, xin = up, (x[..., block] if input_is_parallel else x)
    got = _trace_step(layer, xin, upstream.contiguous())
    got.update(weight=layer.weight.detach(), weight_grad=layer.weight.grad,
               bias_grad=layer.bias.grad, block=block, ref=ref, full=full.weight.detach())
    return got


@pytest.mark.parametrize("t", [2, 4])
@pytest.mark.parametrize("kind, gather_output, input_is_parallel, fwd, bwd", [
    ("column", False, True, [], ["all_reduce"]),
    ("column", True, True, ["all_gather"], ["all_reduce"]),
    ("row", False, True, ["all_reduce"], []),
    ("row", False, False, ["all_reduce"], ["all_gather"]),
])
def test_parallel_linear_matches_nn_linear(t, kind, gather_output, input_is_parallel, fwd,
                                           bwd):
    for r in run(_linear_worker, t, kind, gather_output, input_is_parallel):
        ref, blk = r["ref"], r["block"]
        assert [k for k, _ in r["fwd"]] == fwd and [k for k, _ in r["bwd"]] == bwd
        if kind == "column":
            assert torch.equal(r["weight"], r["full"][blk])
            torch.testing.assert_close(r["y"], ref["y"] if gather_output else ref["y"][..., blk],
                                       **F64)
            torch.testing.assert_close(r["x.grad"], ref["x.grad"], **F64)
            torch.testing.assert_close(r["weight_grad"], ref["weight.grad"][blk], **F64)
            torch.testing.assert_close(r["bias_grad"], ref["bias.grad"][blk], **F64)
        else:
            assert torch.equal(r["weight"], r["full"][:, blk])
            torch.testing.assert_close(r["y"], ref["y"], **F64)
            want_x = ref["x.grad"][..., blk] if input_is_parallel else ref["x.grad"]
            torch.testing.assert_close(r["x.grad"], want_x, **F64)
            torch.testing.assert_close(r["weight_grad"], ref["weight.grad"][:, blk], **F64)
            torch.testing.assert_close(r["bias_grad"], ref["bias.grad"], **F64)


# --- MLP, attention, layer --------------------------------------------------------------------

def _module_worker(kind: str, groups: list[list[int]] | None = None) -> dict:
    rank, t = _rank()
    group = None
    if groups:  # every rank creates every group, in the same order
        made = [dist.new_group(g) for g in groups]
        group = next(m for m, g in zip(made, groups, strict=True) if rank in g)
    torch.manual_seed(11)
    single = {"mlp": lambda: MLP(H), "attention": lambda: Attention(H, HEADS),
              "block": lambda: Block(H, HEADS)}[kind]()
    x, up = torch.randn(B, S, H), torch.randn(B, S, H)
    ref = _reference(single, x, up)
    build = {"mlp": tp.TPMLP.from_mlp, "attention": TPAttention.from_attention,
             "block": TPBlock.from_block}[kind]
    parallel = build(copy.deepcopy(single), group=group)
    got = _trace_step(parallel, x, up)
    got["grads"] = {n: p.grad for n, p in parallel.named_parameters()}
    got["ref"] = ref
    got["group_rank"] = dist.get_rank(group)
    return got


def _expected_mlp_grad(ref: dict, name: str, r: int, t: int) -> torch.Tensor:
    g = ref[f"{name}.grad"]
    if name.startswith("fc1"):
        return g.chunk(t, dim=0)[r]
    return g.chunk(t, dim=1)[r] if name == "fc2.weight" else g


@pytest.mark.parametrize("t", [2, 4])
def test_tp_mlp_matches_single_device_mlp(t):
    for rank, r in enumerate(run(_module_worker, t, "mlp")):
        torch.testing.assert_close(r["y"], r["ref"]["y"], **F32)
        torch.testing.assert_close(r["x.grad"], r["ref"]["x.grad"], **F32)
        assert set(r["grads"]) == {"fc1.weight", "fc1.bias", "fc2.weight", "fc2.bias"}
        for name, grad in r["grads"].items():
            torch.testing.assert_close(grad, _expected_mlp_grad(r["ref"], name, rank, t), **F32)
        assert r["fwd"] == [("all_reduce", (B, S, H))] and r["bwd"] == [("all_reduce", (B, S, H))]


def test_tp_mlp_in_two_tp_groups_of_two():
    """World of 4 = two TP groups {0, 1} and {2, 3}: every collective stays in its group."""
    for r in run(_module_worker, 4, "mlp", [[0, 1], [2, 3]]):
        torch.testing.assert_close(r["y"], r["ref"]["y"], **F32)
        torch.testing.assert_close(r["x.grad"], r["ref"]["x.grad"], **F32)
        for name, grad in r["grads"].items():
            torch.testing.assert_close(
                grad, _expected_mlp_grad(r["ref"], name, r["group_rank"], 2), **F32)
        assert r["group_sizes"] == {2}


@pytest.mark.parametrize("t", [2, 4])
def test_tp_attention_matches_single_device_attention(t):
    c = H // t
    for rank, r in enumerate(run(_module_worker, t, "attention")):
        torch.testing.assert_close(r["y"], r["ref"]["y"], **F32)
        torch.testing.assert_close(r["x.grad"], r["ref"]["x.grad"], **F32)
        rows = torch.cat([torch.arange(j * H + rank * c, j * H + (rank + 1) * c)
                          for j in range(3)])  # this rank's Q, K and V features
        want = {"qkv.weight": r["ref"]["qkv.weight.grad"][rows],
                "qkv.bias": r["ref"]["qkv.bias.grad"][rows],
                "proj.weight": r["ref"]["proj.weight.grad"][:, rank * c:(rank + 1) * c],
                "proj.bias": r["ref"]["proj.bias.grad"]}
        assert set(r["grads"]) == set(want)
        for name, grad in r["grads"].items():
            torch.testing.assert_close(grad, want[name], **F32)
        assert [k for k, _ in r["fwd"]] == ["all_reduce"] == [k for k, _ in r["bwd"]]


@pytest.mark.parametrize("t", [2, 4])
def test_tp_layer_bytes_equal_the_closed_form(t):
    """Forward + backward of one layer: 4 all-reduces of (b, s, h), 16(t-1)/t*bsh bytes in
    bf16, i.e. costs.tp_bytes_per_layer(..., dtype_bytes=4) for this float32 run."""
    want = costs.tp_bytes_per_layer(B, S, H, t, dtype_bytes=4)
    assert want == 4 * 2 * (t - 1) / t * B * S * H * 4  # the formula, by hand
    for r in run(_module_worker, t, "block"):
        torch.testing.assert_close(r["y"], r["ref"]["y"], **F32)
        torch.testing.assert_close(r["x.grad"], r["ref"]["x.grad"], **F32)
        for name in ("ln1.weight", "ln1.bias", "ln2.weight", "ln2.bias"):
            torch.testing.assert_close(r["grads"][name], r["ref"][f"{name}.grad"], **F32)
        assert r["fwd"] == r["bwd"] == [("all_reduce", (B, S, H))] * 2
        assert r["bytes"] == want


# --- divisibility and layout ------------------------------------------------------------------

def _divisibility_worker() -> dict:
    out = {}
    cases = {"heads": lambda: TPAttention.from_attention(Attention(12, 3)),
             "column": lambda: tp.ColumnParallelLinear(4, 7),
             "row": lambda: tp.RowParallelLinear(7, 4)}
    for name, make in cases.items():
        try:
            make()
            out[name] = None
        except ValueError as exc:
            out[name] = str(exc)
    return out


def test_sizes_not_divisible_by_t_are_refused_with_a_fix():
    for r in run(_divisibility_worker, 2):
        assert "n_heads = 3 is not divisible by the tensor-parallel size t = 2" in r["heads"]
        assert "number of heads that t divides" in r["heads"]
        assert "out_features = 7" in r["column"] and "in_features = 7" in r["row"]
    with pytest.raises(ValueError, match="hidden = 10 is not divisible"):
        Attention(10, 4)


def test_heads_first_qkv_puts_each_ranks_heads_together():
    qkv = nn.Linear(8, 24)
    for t in (1, 2, 4):
        out, c = heads_first_qkv(qkv, t), 8 // t
        for r in range(t):
            block = out.weight[r * 3 * c:(r + 1) * 3 * c]
            want = torch.cat([qkv.weight[j * 8 + r * c:j * 8 + (r + 1) * c] for j in range(3)])
            assert torch.equal(block, want)


def test_a_refusal_inside_the_ranks_names_a_rank():
    with pytest.raises(RankError, match=r"rank [01] raised ValueError: out_features = 7"):
        run(_divisibility_worker_raises, 2)  # both ranks raise: either may be reported


def _divisibility_worker_raises() -> None:
    tp.ColumnParallelLinear(4, 7)


# --- PyTorch's own tensor parallelism as an independent reference -----------------------------

def _dtensor_worker() -> tuple:
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor.parallel import (
        ColwiseParallel,
        RowwiseParallel,
        parallelize_module,
    )

    torch.manual_seed(3)
    mlp = MLP(H)
    x = torch.randn(B, S, H)
    ours = tp.TPMLP.from_mlp(copy.deepcopy(mlp))(x)
    mesh = init_device_mesh("cpu", (dist.get_world_size(),))
    theirs = parallelize_module(copy.deepcopy(mlp), mesh,
                                {"fc1": ColwiseParallel(), "fc2": RowwiseParallel()})(x)
    theirs = theirs.wait() if hasattr(theirs, "wait") else theirs  # an AsyncCollectiveTensor:
    return ours.detach(), theirs.detach().clone(), mlp(x).detach()  # wait before sending back


@pytest.mark.slow  # importing DTensor's parallel API takes seconds in each rank
def test_tp_mlp_matches_pytorch_dtensor_tensor_parallelism():
    for ours, theirs, single in run(_dtensor_worker, 2):
        torch.testing.assert_close(ours, theirs, **F32)
        torch.testing.assert_close(theirs, single, **F32)
