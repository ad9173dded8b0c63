r"""Module 03, exercise 3: a TP + SP layer.

The single-device reference is `parlab.tp.DropoutBlock(48, 12, p_drop)` (causal) with every
parameter randomised, LayerNorms included, run on B = 2 sequences of T = 12 tokens in float32,
its dropout masks drawn from a generator seeded with GEN_SEED. Rank r gets rows r*T/t:(r+1)*T/t
of the input and of the upstream gradient and must return the same rows of the output.
Tolerances rtol=1e-5, atol=1e-4 (values of order 10; summation order moves an entry by up to
~1e-5, a wrong shard or a missing reduction by ~1e-1). The layer runs twice: with p_drop = 0,
which isolates the communication and the gradients, then with p_drop = 0.25 (dropout on), and
once more under no_grad to see that the same seed gives the same output. The learner's shards
must own their memory, its LayerNorms must be the block's, and its input must be left as it was.

A right answer must not depend on t (2 and 3 ranks visible, 4 hidden), on the layer's sizes or
head count (48 and 12 here, the notebook's example is 16 and 4: take them from the block and
from x), on p_drop (0 and 0.25), or on the LayerNorms' weights (random here, not ones and
zeros).
"""

from __future__ import annotations

import copy
from typing import Any

import torch

from parlab.check._compare import assert_close, fail, randomize_parameters
from parlab.check._harness import CHECK_TIMEOUT_S, call_learner, exercise, run_checked
from parlab.check.sp.common import (
    BIAS_ONCE,
    F32_TOL,
    GEN_SEED,
    HANG,
    HEADS,
    KEY_BLOCK,
    KIND,
    P_DROP,
    PIECES,
    REPLICATED_GRADS,
    SEED,
    SEQ_DIM,
    B,
    H,
    T,
    expect_kinds,
    guard,
    reject_reference,
    rows,
    times,
)
from parlab.check.tp.common import backward, cpu, env, nonleaf, owns_only, traced, unchanged
from parlab.check.tp.compare import close

__all__ = ["check_sp_block", "block_worker"]
REPLICATED = {"ln1.weight": "ln1.weight", "ln1.bias": "ln1.bias", "ln2.weight": "ln2.weight",
              "ln2.bias": "ln2.bias", "proj.bias": "attn.proj.bias", "fc2.bias": "mlp.fc2.bias"}
SHARDED = {"qkv.weight": "attn.qkv.weight", "qkv.bias": "attn.qkv.bias",
           "proj.weight": "attn.proj.weight", "fc1.weight": "mlp.fc1.weight",
           "fc1.bias": "mlp.fc1.bias", "fc2.weight": "mlp.fc2.weight"}
PATTERN = ["all_gather", "reduce_scatter", "all_gather", "reduce_scatter"]
REGATHER = ["all_gather", "all_gather", "reduce_scatter"] * 2  # Megatron's backward
SHAPE = "return this rank's tokens, (B, T/t, C): the residual stream stays split by sequence"
LAYOUT = ("make check_sp_pair pass first; then the layer: h = gather(ln1(x)); "
          "a = reduce_scatter(attention of h, proj without its bias) + proj.bias; "
          "x = x + sp_dropout(a); then the same with ln2 and the MLP (fc1, GeLU, fc2 without "
          "its bias, reduce-scatter, + fc2.bias)")
DROPOUT = ("the layer is right without dropout but not with it, so your dropout differs from "
           "the single device's (its masks or its 1/(1 - p_drop) scale): make check_sp_dropout "
           "pass, and call sp_dropout after attention and after the MLP, in that order, with "
           "the generator forward receives")
SIZES = (f"the check's layer has B = {B}, T = {T} tokens (T/t rows per rank), hidden C = {H} "
         f"and {HEADS} heads: take every size from x.shape, the block and "
         "dist.get_world_size(), never from the notebook's example; " + SEQ_DIM)
KEEP_LN = ("keep the block's own LayerNorms, as the given __init__ does (copy.deepcopy("
           "block.ln1)): their weight and bias are trained parameters; a new nn.LayerNorm "
           "starts at weight 1 and bias 0")


def _reference(block: Any, x: torch.Tensor, up: torch.Tensor) -> dict:
    xr = x.clone().requires_grad_()
    y = block(xr, torch.Generator().manual_seed(GEN_SEED))
    (y * up).sum().backward()
    ref = {"y": cpu(y), "x.grad": cpu(xr.grad)}
    ref.update({n: cpu(p) for n, p in block.named_parameters()})
    ref.update({f"{n}.grad": cpu(p.grad) for n, p in block.named_parameters()})
    block.zero_grad(set_to_none=True)
    return ref


def _biases_t_times(block: Any, x: torch.Tensor, t: int) -> dict[str, torch.Tensor]:
    """The single-device output with proj.bias, fc2.bias or both counted t times: what a layer
    that adds a row-parallel bias before the reduce-scatter computes."""
    out = {}
    for names in (["attn.proj.bias"], ["mlp.fc2.bias"], ["attn.proj.bias", "mlp.fc2.bias"]):
        wrong = copy.deepcopy(block)
        params = dict(wrong.named_parameters())
        with torch.no_grad():
            for name in names:
                params[name].mul_(t)
            y = wrong(x, torch.Generator().manual_seed(GEN_SEED))
        out[" and ".join(n.split(".", 1)[1] for n in names)] = cpu(y)
    return out


def _learner_run(cls: type, block: Any, x: torch.Tensor, up: torch.Tensor, rank: int,
                 t: int) -> dict:
    model = call_learner(f"{cls.__name__}(block)", cls, copy.deepcopy(block), shape_hint=SEQ_DIM)
    owns_only(model, rank)
    given = rows(x, rank, t).contiguous()
    leaf, xin = nonleaf(given)
    y, fwd = traced(f"{cls.__name__}.forward", model, xin,
                    torch.Generator().manual_seed(GEN_SEED), hint=SIZES, rename=KIND)
    unchanged(given, xin, f"x (the tensor given to {cls.__name__}.forward)", rank)
    bwd = backward(f"{cls.__name__}.forward", y, rows(up, rank, t).contiguous(), rank, SHAPE,
                   shape_hint=SEQ_DIM, rename=KIND)
    _, sync = traced(f"{cls.__name__}.reduce_replicated_grads", model.reduce_replicated_grads,
                     shape_hint=SEQ_DIM, rename=KIND)
    with torch.no_grad():
        again = call_learner(f"{cls.__name__}.forward, a second time", model, xin.detach(),
                             torch.Generator().manual_seed(GEN_SEED), shape_hint=SEQ_DIM)
    out = {"y": cpu(y), "x.grad": cpu(leaf.grad), "again": cpu(again), "forward": fwd,
           "backward": bwd, "sync": sync}
    for name in (*REPLICATED, *SHARDED):
        obj = model
        for part in name.split("."):
            obj = getattr(obj, part, None)
        if not isinstance(obj, torch.Tensor):
            fail(f"{cls.__name__} has no parameter {name}", rank=rank,
                 hint="keep the attributes the skeleton's __init__ makes")
        out[name], out[name + ".grad"] = cpu(obj), cpu(obj.grad)
    return out


def block_worker(cls: type, seed: int, with_tp: bool) -> dict:
    """Rank's results for the reference layer and the learner's, at p_drop = 0 and P_DROP;
    with_tp: also the bytes parlab.tp.TPBlock (plain TP) sends for the same layer."""
    from parlab.comm import trace
    from parlab.tp.attention import TPBlock
    from parlab.tp.block import DropoutBlock

    rank, t, dev = env()
    torch.manual_seed(seed)
    block = DropoutBlock(H, HEADS, p_drop=P_DROP).to(dev)
    randomize_parameters(block, seed=seed)
    x, up = torch.randn(B, T, H, device=dev), torch.randn(B, T, H, device=dev)
    out: dict[Any, Any] = {"ref": {}, "bias_t": {}}  # results by name, and by p_drop
    for p_drop in (0.0, P_DROP):
        block.p_drop = p_drop
        out["ref"][p_drop] = _reference(block, x, up)
        out["bias_t"][p_drop] = _biases_t_times(block, x, t)
    tp_bytes = None
    if with_tp:  # plain TP, parlab's reference, traced before the guard goes on
        with trace() as tr:
            y = TPBlock.from_block(copy.deepcopy(block))(x.clone().requires_grad_())
            (y * up).sum().backward()
        tp_bytes = tr.wire_bytes()
    guard()
    for p_drop in (0.0, P_DROP):
        block.p_drop = p_drop
        out[p_drop] = _learner_run(cls, block, x, up, rank, t)
    out["tp_bytes"] = tp_bytes
    return out


def _shard(ref: torch.Tensor, name: str, rank: int, t: int) -> torch.Tensor:
    if name.startswith("qkv"):  # heads first: rows [Q_r; K_r; V_r]
        c = H // t
        index = torch.cat([torch.arange(j * H + rank * c, j * H + (rank + 1) * c)
                           for j in range(3)])
        return ref[index]
    if name.startswith("fc1"):
        return ref.chunk(t, dim=0)[rank]
    return ref.chunk(t, dim=1)[rank]  # proj.weight, fc2.weight: columns


def _grad_hint(name: str, results: list, p_drop: float, rank: int) -> str | None:
    ref = results[rank]["ref"][p_drop][REPLICATED[name] + ".grad"]
    parts = [r[p_drop][name + ".grad"] for r in results]
    got = parts[rank]
    if got is None:
        return f"{name}.grad is None: no gradient reached it (is something detached?)"
    if all(isinstance(g, torch.Tensor) and g.shape == ref.shape for g in parts) and \
            len(parts) > 1 and close(sum(parts), ref):
        return f"the ranks' gradients of {name} add up to the reference: " + REPLICATED_GRADS
    c = times(got, ref)
    if c is not None and abs(c - len(parts)) < 1e-3:
        return (f"{name}.grad is t = {len(parts)} times the reference: it was summed over ranks "
                "twice, or summed although it was already whole")
    return None


def _check_outputs(results: list, p_drop: float, t: int) -> None:
    where = f"SPBlock with dropout p_drop = {p_drop}"
    for rank, res in enumerate(results):
        r, ref = res[p_drop], res["ref"][p_drop]
        for name in ("ln1.weight", "ln1.bias", "ln2.weight", "ln2.bias"):
            if not close(r[name], ref[name], rtol=0, atol=0):
                fail(f"SPBlock's {name} is not the block's {name}", rank=rank, hint=KEEP_LN)
        y, want = r["y"], rows(ref["y"], rank, t)
        if p_drop == 0 and isinstance(y, torch.Tensor) and not bool(torch.isfinite(y).all()):
            fail(f"the output of {where} holds NaN or infinity: your dropout differs from the "
                 "single device's", rank=rank, hint="with p_drop = 0 nothing is dropped, so a "
                 "division by p_drop is a division by zero: scale the kept values by "
                 "1/(1 - p_drop), one over the probability of keeping an element")
        for names, wrong in res["bias_t"][p_drop].items():
            if t > 1 and close(y, rows(wrong, rank, t), **F32_TOL) and not close(y, want):
                fail(f"the output of {where} is the single-device layer's with {names} "
                     f"counted t = {t} times", rank=rank, hint=BIAS_ONCE)
        assert_close(y, want, name=f"output of {where} (this rank's rows)", rank=rank,
                     hint=LAYOUT if p_drop == 0 else DROPOUT, **F32_TOL)
    if p_drop == 0:
        expect_kinds([r[p_drop] for r in results], "forward", "SPBlock", PATTERN,
                     "a TP + SP layer enters attention and the MLP with an all-gather and "
                     "leaves each with a reduce-scatter")
    for rank, res in enumerate(results):
        assert_close(res[p_drop]["x.grad"], rows(res["ref"][p_drop]["x.grad"], rank, t),
                     rank=rank, **F32_TOL, name=f"grad of x (this rank's rows) in {where}",
                     hint="the output is right but the input gradient is not: look at the "
                          "backward of your gather and reduce-scatter (check_sp_pair)")
    if p_drop == 0 and [e[0] for e in results[0][p_drop]["backward"]] == REGATHER:
        fail("SPBlock's backward gathers each LayerNorm output again before its GEMM's weight "
             "gradient (all-gather, all-gather, reduce-scatter, twice): Megatron-LM's layer, "
             "which keeps only the shard", rank=0,
             hint="this exercise builds the layer that keeps the gathered input: give F.linear "
                  "the gathered tensor and let autograd save it (section 6 compares the two)")
    if p_drop == 0:
        expect_kinds([r[p_drop] for r in results], "backward", "SPBlock", PATTERN,
                     "the backward makes the conjugates: an all-gather for each reduce-scatter "
                     "and a reduce-scatter for each all-gather")


def _check_grads(results: list, p_drop: float, t: int) -> None:
    where = f"SPBlock with dropout p_drop = {p_drop}"
    for rank, res in enumerate(results):
        r, ref = res[p_drop], res["ref"][p_drop]
        for name, ref_name in SHARDED.items():
            assert_close(r[name + ".grad"], _shard(ref[ref_name + ".grad"], name, rank, t),
                         name=f"grad of {name} (this rank's shard) in {where}", rank=rank,
                         **F32_TOL, hint="the input gradient is right, so look at how this "
                                         "parameter is used in forward")
        for name, ref_name in REPLICATED.items():
            if r[name + ".grad"] is None or not close(r[name + ".grad"],
                                                      ref[ref_name + ".grad"], **F32_TOL):
                assert_close(r[name + ".grad"], ref[ref_name + ".grad"], rank=rank, **F32_TOL,
                             name=f"grad of {name} after reduce_replicated_grads in {where}",
                             hint=_grad_hint(name, results, p_drop, rank))
        bad = [k for k, _, _ in r["sync"] if k != "all_reduce"]
        if bad:
            fail(f"reduce_replicated_grads made these collective calls: {bad}", rank=rank,
                 hint="every rank holds the whole parameter: all-reduce its gradient")
        assert_close(r["again"], rows(ref["y"], rank, t), rank=rank, **F32_TOL,
                     name=f"output of a second forward with the same seed in {where}",
                     hint="use only the generator forward receives: the same seed must give "
                          "the same masks")


@exercise(KEY_BLOCK, needs=PIECES)
def check_sp_block(cls: type, *, world_size: int = 2, seed: int = SEED,
                   timeout: float = CHECK_TIMEOUT_S, quiet: bool = False) -> None:
    """SPBlock(block) against DropoutBlock: output rows, grad of x, every parameter's grad
    (after reduce_replicated_grads), the collectives, dropout masks reproducible."""
    reject_reference(cls, "SPBlock")
    t = world_size
    results = run_checked(block_worker, t, cls, seed, False, what="SPBlock", timeout=timeout,
                          hang_hint=HANG)
    for p_drop in (0.0, P_DROP):
        _check_outputs(results, p_drop, t)
        _check_grads(results, p_drop, t)
    if not quiet:
        print(f"SPBlock OK on {t} ranks: each rank's {T // t} of {T} tokens, output and every "
              f"gradient match the single-device layer, with dropout p_drop = {P_DROP} "
              f"(float32, rtol={F32_TOL['rtol']:g}, atol={F32_TOL['atol']:g}); all-gather in, "
              "reduce-scatter out; LayerNorm and bias gradients all-reduced")
