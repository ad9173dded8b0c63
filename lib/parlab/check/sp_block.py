r"""Graded checks of module 03, exercises 3 and 4: a TP + SP layer, and its bytes.

The single-device reference is `parlab.tp.DropoutBlock(16, 4, p)` (causal) with seeded
weights, run on B = 2 sequences of T = 8 tokens in float32, its dropout masks drawn from a
generator seeded with GEN_SEED. Rank r gets rows r*T/t:(r+1)*T/t of the input and of the
upstream gradient and must return the same rows of the output. Tolerances rtol=1e-5,
atol=1e-6 (summation order moves float32 by ~1e-7; a wrong shard or a missing reduction moves
it by ~1e-1). The layer runs twice: with p = 0, which isolates the communication and the
gradients, then with p = 0.25 (dropout on), and once more under no_grad to see that the same
seed gives the same output.

Bytes: the tracer's sums over forward + backward, for the learner's layer by kind and for
parlab.tp.TPBlock (plain TP, run before the guard), against layer_bytes(...) and
$4\frac{t-1}{t}bsh\,d$ per kind, i.e. `parlab.costs.tp_bytes_per_layer` in all (d = 4 here).
"""

from __future__ import annotations

import copy
import math
from collections.abc import Callable
from typing import Any

import torch

from parlab import costs
from parlab.check import CHECK_TIMEOUT_S, assert_close, fail, not_reexport
from parlab.check.sp_common import (
    BIAS_ONCE,
    F32_TOL,
    GEN_SEED,
    HEADS,
    REPLICATED_GRADS,
    SEED,
    B,
    H,
    P,
    T,
    _backward,
    _call,
    _close,
    _cpu,
    _env,
    _expect_kinds,
    _guard,
    _reject_reference,
    _rows,
    _run,
    _times,
    _traced,
)
from parlab.comm import trace
from parlab.tp import sequence as sp

REPLICATED = {"ln1.weight": "ln1.weight", "ln1.bias": "ln1.bias", "ln2.weight": "ln2.weight",
              "ln2.bias": "ln2.bias", "proj.bias": "attn.proj.bias", "fc2.bias": "mlp.fc2.bias"}
SHARDED = {"qkv.weight": "attn.qkv.weight", "qkv.bias": "attn.qkv.bias",
           "proj.weight": "attn.proj.weight", "fc1.weight": "mlp.fc1.weight",
           "fc1.bias": "mlp.fc1.bias", "fc2.weight": "mlp.fc2.weight"}
PATTERN = ["all_gather", "reduce_scatter", "all_gather", "reduce_scatter"]
SHAPE = "return this rank's tokens, (B, T/t, C): the residual stream stays split by sequence"
LAYOUT = ("make check_sp_pair pass first; then the layer: h = gather(ln1(x)); "
          "a = reduce_scatter(attention of h, proj without its bias) + proj.bias; "
          "x = x + sp_dropout(a); then the same with ln2 and the MLP (fc1, GeLU, fc2 without "
          "its bias, reduce-scatter, + fc2.bias)")


def _reference(block: Any, x: torch.Tensor, up: torch.Tensor) -> dict:
    xr = x.clone().requires_grad_()
    y = block(xr, torch.Generator().manual_seed(GEN_SEED))
    (y * up).sum().backward()
    ref = {"y": _cpu(y), "x.grad": _cpu(xr.grad)}
    ref.update({n: _cpu(p) for n, p in block.named_parameters()})
    ref.update({f"{n}.grad": _cpu(p.grad) for n, p in block.named_parameters()})
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
        out[" and ".join(n.split(".", 1)[1] for n in names)] = _cpu(y)
    return out


def _learner_run(cls: type, block: Any, x: torch.Tensor, up: torch.Tensor, rank: int,
                 t: int) -> dict:
    model = _call(f"{cls.__name__}(block)", cls, copy.deepcopy(block))
    xin = _rows(x, rank, t).clone().requires_grad_()
    y, fwd = _traced(f"{cls.__name__}.forward", model, xin,
                     torch.Generator().manual_seed(GEN_SEED))
    bwd = _backward(f"{cls.__name__}.forward", y, _rows(up, rank, t).contiguous(), rank, SHAPE)
    _, sync = _traced(f"{cls.__name__}.reduce_replicated_grads", model.reduce_replicated_grads)
    with torch.no_grad():
        again = _call(f"{cls.__name__}.forward, a second time", model, xin.detach(),
                      torch.Generator().manual_seed(GEN_SEED))
    out = {"y": _cpu(y), "x.grad": _cpu(xin.grad), "again": _cpu(again), "forward": fwd,
           "backward": bwd, "sync": sync}
    for name in (*REPLICATED, *SHARDED):
        obj = model
        for part in name.split("."):
            obj = getattr(obj, part, None)
        if not isinstance(obj, torch.Tensor):
            fail(f"{cls.__name__} has no parameter {name}", rank=rank,
                 hint="keep the attributes the skeleton's __init__ makes")
        out[name + ".grad"] = _cpu(obj.grad)
    return out


def _block_worker(cls: type, seed: int, with_tp: bool) -> dict:
    from parlab.tp.attention import TPBlock
    from parlab.tp.block import DropoutBlock

    rank, t, dev = _env()
    torch.manual_seed(seed)
    block = DropoutBlock(H, HEADS, p=P).to(dev)
    x, up = torch.randn(B, T, H, device=dev), torch.randn(B, T, H, device=dev)
    out: dict[str, Any] = {"ref": {}, "bias_t": {}}
    for p in (0.0, P):
        block.p = p
        out["ref"][p] = _reference(block, x, up)
        out["bias_t"][p] = _biases_t_times(block, x, t)
    tp_bytes = None
    if with_tp:  # plain TP, parlab's reference, traced before the guard goes on
        with trace() as tr:
            y = TPBlock.from_block(copy.deepcopy(block))(x.clone().requires_grad_())
            (y * up).sum().backward()
        tp_bytes = tr.wire_bytes()
    _guard()
    for p in (0.0, P):
        block.p = p
        out[p] = _learner_run(cls, block, x, up, rank, t)
    out["tp_bytes"] = tp_bytes
    return out


def _shard(ref: torch.Tensor, name: str, rank: int, t: int) -> torch.Tensor:
    if name.startswith("qkv"):  # heads first: rows [Q_r; K_r; V_r]
        c = H // t
        rows = torch.cat([torch.arange(j * H + rank * c, j * H + (rank + 1) * c)
                          for j in range(3)])
        return ref[rows]
    if name.startswith("fc1"):
        return ref.chunk(t, dim=0)[rank]
    return ref.chunk(t, dim=1)[rank]  # proj.weight, fc2.weight: columns


def _grad_hint(name: str, results: list, p: float, rank: int) -> str | None:
    ref = results[rank]["ref"][p][REPLICATED[name] + ".grad"]
    parts = [r[p][name + ".grad"] for r in results]
    got = parts[rank]
    if got is None:
        return f"{name}.grad is None: no gradient reached it (is something detached?)"
    if all(isinstance(g, torch.Tensor) and g.shape == ref.shape for g in parts) and \
            len(parts) > 1 and _close(sum(parts), ref):
        return f"the ranks' gradients of {name} add up to the reference: " + REPLICATED_GRADS
    c = _times(got, ref)
    if c is not None and abs(c - len(parts)) < 1e-3:
        return (f"{name}.grad is t = {len(parts)} times the reference: it was summed over ranks "
                "twice, or summed although it was already whole")
    return None


def _check_run(results: list, p: float, t: int) -> None:
    where = f"SPBlock with dropout p = {p}"
    for rank, res in enumerate(results):
        r, ref = res[p], res["ref"][p]
        y, want = r["y"], _rows(ref["y"], rank, t)
        for names, wrong in res["bias_t"][p].items():
            if t > 1 and _close(y, _rows(wrong, rank, t), **F32_TOL) and not _close(y, want):
                fail(f"the output of {where} is the single-device layer's with {names} "
                     f"counted t = {t} times", rank=rank, hint=BIAS_ONCE)
        hint = LAYOUT if p == 0 else (
            "the layer is right without dropout but not with it, so the dropout masks differ "
            "from the single device's: make check_sp_dropout pass, and call sp_dropout after "
            "attention and after the MLP, in that order, with the generator forward receives")
        assert_close(y, want, name=f"output of {where} (this rank's rows)", rank=rank,
                     hint=hint, **F32_TOL)
    if p == 0:
        _expect_kinds([r[p] for r in results], "forward", "SPBlock", PATTERN,
                      "a TP + SP layer enters attention and the MLP with an all-gather and "
                      "leaves each with a reduce-scatter")
    for rank, res in enumerate(results):
        assert_close(res[p]["x.grad"], _rows(res["ref"][p]["x.grad"], rank, t), rank=rank,
                     **F32_TOL, name=f"grad of x (this rank's rows) in {where}",
                     hint="the output is right but the input gradient is not: look at the "
                          "backward of your gather and reduce-scatter (check_sp_pair)")
    if p == 0:
        _expect_kinds([r[p] for r in results], "backward", "SPBlock", PATTERN,
                      "the backward makes the conjugates: an all-gather for each reduce-scatter "
                      "and a reduce-scatter for each all-gather")
    for rank, res in enumerate(results):
        r, ref = res[p], res["ref"][p]
        for name, ref_name in SHARDED.items():
            assert_close(r[name + ".grad"], _shard(ref[ref_name + ".grad"], name, rank, t),
                         name=f"grad of {name} (this rank's shard) in {where}", rank=rank,
                         **F32_TOL, hint="the input gradient is right, so look at how this "
                                         "parameter is used in forward")
        for name, ref_name in REPLICATED.items():
            if r[name + ".grad"] is None or not _close(r[name + ".grad"],
                                                       ref[ref_name + ".grad"], **F32_TOL):
                assert_close(r[name + ".grad"], ref[ref_name + ".grad"], rank=rank, **F32_TOL,
                             name=f"grad of {name} after reduce_replicated_grads in {where}",
                             hint=_grad_hint(name, results, p, rank))
        bad = [k for k, _, _ in r["sync"] if k != "all_reduce"]
        if bad:
            fail(f"reduce_replicated_grads made these collective calls: {bad}", rank=rank,
                 hint="every rank holds the whole parameter: all-reduce its gradient")
        assert_close(r["again"], _ref_rows(res, p, rank, t), rank=rank, **F32_TOL,
                     name=f"output of a second forward with the same seed in {where}",
                     hint="use only the generator forward receives: the same seed must give "
                          "the same masks")


def _ref_rows(res: dict, p: float, rank: int, t: int) -> torch.Tensor:
    return _rows(res["ref"][p]["y"], rank, t)


def check_sp_block(cls: type, *, world_size: int = 2, seed: int = SEED,
                   timeout: float = CHECK_TIMEOUT_S, quiet: bool = False) -> None:
    """SPBlock(block) against DropoutBlock: output rows, grad of x, every parameter's grad
    (after reduce_replicated_grads), the collectives, dropout masks reproducible."""
    _reject_reference(cls, "SPBlock")
    t = world_size
    results = _run(_block_worker, t, cls, seed, False, what="SPBlock", timeout=timeout)
    for p in (0.0, P):
        _check_run(results, p, t)
    if not quiet:
        print(f"SPBlock OK on {t} ranks: each rank's {T // t} of {T} tokens, output and every "
              f"gradient match the single-device layer, with dropout p = {P} (float32, "
              f"rtol={F32_TOL['rtol']:g}, atol={F32_TOL['atol']:g}); all-gather in, "
              "reduce-scatter out; LayerNorm and bias gradients all-reduced")


# --- exercise 4: the bytes --------------------------------------------------------------------

def _check_formula(layer_bytes: Callable[..., Any]) -> None:
    not_reexport(layer_bytes, name="sp_layer_bytes")
    for b, s, h, t, d in ((1, 8192, 8192, 8, 2), (B, T, H, 2, 4), (B, T, H, 4, 4),
                          (4, 2048, 4096, 2, 2), (1, 1024, 2048, 1, 2)):
        call = f"sp_layer_bytes(b={b}, s={s}, h={h}, t={t}, dtype_bytes={d})"
        want = sp.sp_bytes_per_layer(b, s, h, t, dtype_bytes=d)
        got = layer_bytes(b, s, h, t, d)
        if not isinstance(got, dict) or set(got) != set(want):
            fail(f"{call} returned {got!r:.80}, expected a dict with keys 'all_gather' and "
                 "'reduce_scatter' (bytes one rank sends per layer, forward + backward)")
        for kind, value in want.items():
            if not isinstance(got[kind], (int, float)) or not math.isclose(
                    got[kind], value, rel_tol=1e-9, abs_tol=1e-9):
                ratio = got[kind] / value if value and isinstance(got[kind], (int, float)) else 0
                fail(f"{call}[{kind!r}] = {got[kind]!r}, expected {value:,.0f}", hint=(
                    "count 4 per layer: 2 in forward (attention and MLP) and 2 in backward"
                    if math.isclose(ratio, 0.5) else "one ring all-gather or reduce-scatter "
                    "of n bytes sends (t-1)/t * n" if math.isclose(ratio, 2.0) else
                    "4 collectives of b*s*h elements of dtype_bytes each, (t-1)/t per ring"))


def check_sp_bytes(cls: type, layer_bytes: Callable[..., Any], *, world_size: int = 2,
                   seed: int = SEED, timeout: float = CHECK_TIMEOUT_S,
                   quiet: bool = False) -> dict:
    """The tracer's bytes over forward + backward of SPBlock, by kind, against layer_bytes and
    against plain TP's (parlab.tp.TPBlock, same layer). Returns rank 0's numbers."""
    _reject_reference(cls, "SPBlock")
    _check_formula(layer_bytes)
    t = world_size
    results = _run(_block_worker, t, cls, seed, True, what="SPBlock", timeout=timeout)
    formula = {k: float(v) for k, v in layer_bytes(B, T, H, t, 4).items()}
    tp_total = costs.tp_bytes_per_layer(B, T, H, t, dtype_bytes=4)
    for rank, res in enumerate(results):
        events = res[P]["forward"] + res[P]["backward"]
        measured = {k: sum(e[2] for e in events if e[0] == k) for k in formula}
        for kind, value in formula.items():
            if not math.isclose(measured[kind], value, rel_tol=1e-12):
                fail(f"the tracer counted {measured[kind]:,.0f} B of {kind} over forward + "
                     f"backward of SPBlock, expected {value:,.0f} B", rank=rank,
                     hint="make check_sp_block pass first: 2 all-gathers and 2 reduce-scatters "
                          "of the (B, T, C) activation each way")
        if not math.isclose(res["tp_bytes"], tp_total, rel_tol=1e-12) or not math.isclose(
                sum(measured.values()), res["tp_bytes"], rel_tol=1e-12):
            fail(f"TP + SP sent {sum(measured.values()):,.0f} B, plain TP {res['tp_bytes']:,.0f}"
                 f" B; both should be {tp_total:,.0f} B", rank=rank)
    r0 = results[0]
    events = r0[P]["forward"] + r0[P]["backward"]
    summary = {"b": B, "s": T, "h": H, "t": t, "dtype_bytes": 4, "tp": r0["tp_bytes"],
               "sp": {k: sum(e[2] for e in events if e[0] == k) for k in formula},
               "formula": formula, "costs": tp_total}
    if not quiet:
        print(f"bytes OK on {t} ranks (b={B}, s={T}, h={H}, float32): rank 0 sent "
              f"{summary['sp']['all_gather']:,.0f} B in all-gathers + "
              f"{summary['sp']['reduce_scatter']:,.0f} B in reduce-scatters = "
              f"{sum(summary['sp'].values()):,.0f} B under TP + SP, and {summary['tp']:,.0f} B "
              "in all-reduces under plain TP")
    return summary
