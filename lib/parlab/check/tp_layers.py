r"""Graded checks of module 02, exercises 4 to 6: row-parallel first, TP attention, a TP layer.

Same conventions as `parlab.check.tp` (helpers in `parlab.check.tp_common`): float32,
rtol=1e-5, atol=1e-6 against parlab.model.MLP and parlab.model.Attention / Block built
from the same seeded weights, collectives counted by the tracer, parlab's own TP classes
blocked in the ranks (the row-first check runs parlab.tp.TPMLP first, for comparison).

The layer's bytes: a rank sends $4 \cdot 2\frac{t-1}{t}\,bsh\,d$ bytes per layer, forward and
backward (`parlab.costs.tp_bytes_per_layer`, d = 4 for the float32 used here; the course's
$16\frac{t-1}{t}bsh$ is d = 2, bf16).
"""

from __future__ import annotations

import copy
import math
from collections.abc import Callable

import torch

from parlab import costs
from parlab.check import CHECK_TIMEOUT_S, fail, not_reexport
from parlab.check.tp_common import (
    BIAS_ONCE,
    F32_TOL,
    F_BACKWARD,
    G_BACKWARD,
    HEADS,
    SEED,
    B,
    H,
    S,
    _backward,
    _bias_counted,
    _call,
    _close,
    _compare,
    _cpu,
    _env,
    _expect_events,
    _grads,
    _guard,
    _kinds,
    _mlp_setup,
    _reject_reference,
    _run,
    _traced,
)

QKV_LAYOUT = ("attn.qkv's rows are [Q; K; V] (each C rows, head h at rows h*d:(h+1)*d): a "
              "contiguous block of 3C/t rows is not one rank's heads. Rank r needs the Q, K and "
              "V rows of its heads, stacked as [Q_r; K_r; V_r]")


# --- exercise 4: row-parallel first ---------------------------------------------------------------

def _row_first_worker(cls: type, seed: int) -> dict:
    from parlab.tp.layers import TPMLP

    rank, t, dev = _env()
    mlp, x, up, ref = _mlp_setup(seed, dev)
    reference = TPMLP.from_mlp(copy.deepcopy(mlp))  # column -> row, before the guard goes on
    y, ref_fwd = _traced("parlab.tp.TPMLP", reference, x.clone().requires_grad_())
    ref_bwd = _backward("parlab.tp.TPMLP", y, up, rank)
    _guard()
    model = _call(f"{cls.__name__}(mlp)", cls, copy.deepcopy(mlp))
    xin = x.clone().requires_grad_()
    y, fwd = _traced(f"{cls.__name__}.forward", model, xin)
    bwd = _backward(f"{cls.__name__}.forward", y, up, rank)
    return {"ref": ref, "y": _cpu(y), "x.grad": _cpu(xin.grad), "forward": fwd, "backward": bwd,
            "column_row": {"forward": ref_fwd, "backward": ref_bwd}}


def check_row_first(cls: type, *, world_size: int = 2, seed: int = SEED,
                    timeout: float = CHECK_TIMEOUT_S, quiet: bool = False) -> dict:
    """RowFirstMLP(mlp): fc1 row-parallel. Same output and input gradient as the MLP, and the
    tracer must count an all-reduce of the (B, T, 4C) pre-activation before any other
    collective of the forward. Returns rank 0's counts for both orders."""
    _reject_reference(cls, "RowFirstMLP")
    t = world_size
    results = _run(_row_first_worker, t, cls, seed, what="RowFirstMLP", timeout=timeout)
    _compare(results, t, [("output", lambda r: r["y"], lambda r: r["ref"]["y"]),
                          ("grad of x (the MLP's input)", lambda r: r["x.grad"],
                           lambda r: r["ref"]["x.grad"])], F32_TOL)
    for rank, r in enumerate(results):
        ev = r["forward"]
        if len(ev) < 2 or ev[0][0] != "all_reduce" or ev[0][1][-1] != 4 * H:
            fail(f"the forward of RowFirstMLP made these collective calls: {_kinds(ev)}; "
                 f"expected first an all_reduce of the (B, T, 4C) = {(B, S, 4 * H)} "
                 "pre-activation, then the collective that completes fc2", rank=rank,
                 hint="make fc1 row-parallel: each rank multiplies its slice of x by its rows "
                      "of fc1's weight, and the partial sums must be all-reduced before the GeLU")
    summary = {"row_first": {k: results[0][k] for k in ("forward", "backward")},
               "column_row": results[0]["column_row"]}
    if not quiet:
        print(f"RowFirstMLP OK on {t} ranks. Collectives counted by the tracer on rank 0:")
        for name, key in (("column -> row (TPMLP)", "column_row"),
                          ("row first (RowFirstMLP)", "row_first")):
            for phase in ("forward", "backward"):
                ev = summary[key][phase]
                print(f"  {name:<24} {phase:<8} {len(ev)} call(s), "
                      f"{sum(e[2] for e in ev):>6,.0f} B sent: {_kinds(ev)}")
    return summary


# --- exercise 5: attention split by heads -----------------------------------------------------

def _setup(kind: str, seed: int, dev: torch.device) -> tuple:
    from parlab.model.transformer import Attention, Block

    torch.manual_seed(seed)
    module = (Attention(H, HEADS) if kind == "attention" else Block(H, HEADS)).to(dev)
    x = torch.randn(B, S, H, device=dev)
    up = torch.randn(B, S, H, device=dev)
    xr = x.clone().requires_grad_()
    y = module(xr)
    (y * up).sum().backward()
    ref = {"y": _cpu(y), "x.grad": _cpu(xr.grad)}
    ref.update({n: _cpu(p) for n, p in module.named_parameters()})
    ref.update({f"{n}.grad": _cpu(p.grad) for n, p in module.named_parameters()})
    module.zero_grad(set_to_none=True)
    return module, x, up, ref


def _divisibility(cls: type, t: int, dev: torch.device, rank: int) -> None:
    """TPAttention must refuse t+1 heads on t ranks with a ValueError that names the heads."""
    from parlab.model.transformer import Attention

    heads = t + 1
    bad = Attention(4 * heads, heads).to(dev)
    stage = f"{cls.__name__}(attention with {heads} heads, hidden {4 * heads}) on {t} ranks"
    hint = (f"raise ValueError(f\"n_heads = {heads} is not divisible by t = {t}; ...\") in "
            "__init__, saying what to change: TP gives every rank whole heads")
    try:
        cls(bad)
    except (NotImplementedError, AssertionError):
        raise
    except ValueError as exc:
        if "head" not in str(exc).lower():
            fail(f"{stage} raised ValueError({str(exc)!r}), which does not mention the heads",
                 rank=rank, hint=hint)
        return
    except Exception as exc:  # noqa: BLE001 - reported to the learner
        fail(f"{stage} raised {type(exc).__name__}: {exc}", rank=rank, hint=hint)
    fail(f"{stage} was accepted", rank=rank, hint=hint)


def _attention_worker(cls: type, seed: int) -> dict:
    rank, t, dev = _env()
    _guard()
    attn, x, up, ref = _setup("attention", seed, dev)
    model = _call(f"{cls.__name__}(attn)", cls, copy.deepcopy(attn))
    xin = x.clone().requires_grad_()
    y, fwd = _traced(f"{cls.__name__}.forward", model, xin)
    bwd = _backward(f"{cls.__name__}.forward", y, up, rank)
    got = _grads(model, ("qkv.weight", "qkv.bias", "proj.weight", "proj.bias"), rank)
    _divisibility(cls, t, dev, rank)
    return {"ref": ref, "y": _cpu(y), "x.grad": _cpu(xin.grad), "forward": fwd,
            "backward": bwd, "rank": rank, **{p: v for p, (v, _) in got.items()},
            **{p + ".grad": g for p, (_, g) in got.items()}}


def _qkv_rows(rank: int, t: int) -> torch.Tensor:
    """Rows of the fused [Q; K; V] weight that hold rank's heads, in [Q_r; K_r; V_r] order."""
    c = H // t
    return torch.cat([torch.arange(j * H + rank * c, j * H + (rank + 1) * c) for j in range(3)])


def check_tp_attention(cls: type, *, world_size: int = 2, seed: int = SEED,
                       timeout: float = CHECK_TIMEOUT_S, quiet: bool = False) -> None:
    """TPAttention(attn) against parlab.model.Attention (causal, 4 heads, C = 16):
    output, grad of x, of qkv (rows [Q_r; K_r; V_r]) and proj; ValueError for t+1 heads."""
    _reject_reference(cls, "TPAttention")
    t = world_size
    results = _run(_attention_worker, t, cls, seed, what="TPAttention", timeout=timeout)
    c = H // t
    for rank, r in enumerate(results):
        w = r["qkv.weight"]
        if w.shape == (3 * c, H) and torch.equal(w, r["ref"]["qkv.weight"][rank * 3 * c:
                                                                         (rank + 1) * 3 * c]):
            fail("qkv.weight holds a contiguous block of rows of attn.qkv.weight", rank=rank,
                 hint=QKV_LAYOUT)
        if _bias_counted(r["y"], r["ref"]["y"], r["ref"]["proj.bias"], t):
            fail(f"the output is off by (t - 1) x proj.bias = {t - 1} x proj.bias", rank=rank,
                 hint=BIAS_ONCE)
    shards = {
        "qkv.weight": lambda r, p: r["ref"][p][_qkv_rows(r["rank"], t)],
        "qkv.bias": lambda r, p: r["ref"][p][_qkv_rows(r["rank"], t)],
        "proj.weight": lambda r, p: r["ref"][p][:, r["rank"] * c:(r["rank"] + 1) * c],
        "proj.bias": lambda r, p: r["ref"][p],
    }
    for p, shard in shards.items():  # the shards first: a wrong one explains a wrong output
        _compare(results, t, [(p, lambda r, p=p: r[p], lambda r, p=p, s=shard: s(r, p))],
                 {"rtol": 0, "atol": 0}, hint=QKV_LAYOUT if p.startswith("qkv") else
                 "proj is row-parallel: rank r keeps columns r*C/t:(r+1)*C/t of its weight")
    _compare(results, t, [("output", lambda r: r["y"], lambda r: r["ref"]["y"])], F32_TOL,
             hint="the shards are right, so look at forward: split qkv's output into q, k, v "
                  "(C/t each), run attention over n_heads/t heads, then proj")
    _expect_events(results, "forward", "TPAttention", ["all_reduce"], lambda ev: (
        "attention needs one all-reduce in forward, g, in the row-parallel output projection"))
    grads = [("grad of x (the attention's input)", lambda r: r["x.grad"],
              lambda r: r["ref"]["x.grad"])]
    grads += [(f"grad of {p}", lambda r, p=p: r[p + ".grad"],
               lambda r, p=p, s=shard: s(r, p + ".grad")) for p, shard in shards.items()]
    _compare(results, t, grads, F32_TOL)
    _expect_events(results, "backward", "TPAttention", ["all_reduce"], lambda ev: (
        F_BACKWARD if not ev else
        f"{len(ev)} all-reduces in backward: apply f once, to x, before one fused qkv "
        "column-parallel projection (three separate f's all-reduce three times)"
        if len(ev) == 3 else G_BACKWARD))
    if not quiet:
        print(f"TPAttention OK on {t} ranks ({HEADS // t} of {HEADS} heads per rank): output "
              "and the gradients of x, qkv and proj match single-device attention (float32, "
              f"rtol={F32_TOL['rtol']:g}, atol={F32_TOL['atol']:g}); {t + 1} heads rejected "
              "with a ValueError")


# --- exercise 6: a TP transformer layer and its bytes ---------------------------------------------

def _block_worker(cls: type, seed: int) -> dict:
    rank, t, dev = _env()
    _guard()
    block, x, up, ref = _setup("block", seed, dev)
    model = _call(f"{cls.__name__}(block)", cls, copy.deepcopy(block))
    xin = x.clone().requires_grad_()
    y, fwd = _traced(f"{cls.__name__}.forward", model, xin)
    bwd = _backward(f"{cls.__name__}.forward", y, up, rank)
    got = _grads(model, ("ln1.weight", "ln1.bias", "ln2.weight", "ln2.bias"), rank)
    return {"ref": ref, "y": _cpu(y), "x.grad": _cpu(xin.grad), "forward": fwd,
            "backward": bwd, **{p + ".grad": g for p, (_, g) in got.items()}}


def _formula_points(t: int) -> list[tuple[int, int, int, int, int]]:
    return [(1, 8192, 8192, 8, 2), (B, S, H, t, 4), (4, 2048, 4096, 2, 2), (2, 512, 1024, 4, 4),
            (1, 1024, 2048, 1, 2)]


def _check_formula(layer_bytes: Callable[..., float]) -> None:
    not_reexport(layer_bytes, name="layer_bytes")
    for b, s, h, t, d in _formula_points(2):
        want = costs.tp_bytes_per_layer(b, s, h, t, dtype_bytes=d)
        call = f"layer_bytes(b={b}, s={s}, h={h}, t={t}, dtype_bytes={d})"
        got = layer_bytes(b, s, h, t, d)
        if isinstance(got, bool) or not isinstance(got, (int, float)):
            fail(f"{call} returned {type(got).__name__}, expected a number ({want:,.0f})")
        if math.isclose(got, want, rel_tol=1e-9, abs_tol=1e-9):
            continue
        ratio = got / want if want else float("nan")
        hints = {2.0: "a ring all-reduce of n bytes sends 2(t-1)/t * n, and a layer has 4",
                 0.5: "count 4 all-reduces per layer: 2 forward (after attention and after the "
                      "MLP) and 2 backward (their conjugates, f)",
                 t / (t - 1) if t > 1 else 0: "each rank sends (t-1)/t of the data, twice",
                 float(d): "bsh is a count of elements: multiply by dtype_bytes, once",
                 1 / d: "multiply the element count b*s*h by dtype_bytes"}
        hint = next((v for k, v in hints.items() if math.isclose(ratio, k, rel_tol=1e-6)),
                    "4 all-reduces of b*s*h elements of dtype_bytes each, 2(t-1)/t per ring")
        if want == 0:
            hint = "with t = 1 there is nobody to talk to: 0 bytes"
        fail(f"{call} = {got:,.6g}, expected {want:,.0f}", hint=hint)


def check_tp_block(cls: type, layer_bytes: Callable[..., float], *, world_size: int = 2,
                   seed: int = SEED, timeout: float = CHECK_TIMEOUT_S,
                   quiet: bool = False) -> dict:
    """TPBlock(block) against parlab.model.Block, and the bytes the tracer counts over
    forward + backward against layer_bytes(...) and parlab.costs.tp_bytes_per_layer."""
    _reject_reference(cls, "TPBlock")
    _check_formula(layer_bytes)
    t = world_size
    results = _run(_block_worker, t, cls, seed, what="TPBlock", timeout=timeout)
    _compare(results, t, [("output", lambda r: r["y"], lambda r: r["ref"]["y"])], F32_TOL,
             hint="make the checks of TPMLP and TPAttention pass first; the layer adds only "
                  "replicated LayerNorms and residuals: x + attn(ln1(x)), then x + mlp(ln2(x))")
    for when, pointer in (("forward", "g after attention and after the MLP"),
                          ("backward", "f before attention and before the MLP")):
        why = f"a TP layer all-reduces exactly twice in its {when}: {pointer}"
        _expect_events(results, when, "TPBlock", ["all_reduce", "all_reduce"],
                       lambda ev, why=why: why)
    _compare(results, t, [("grad of x (the layer's input)", lambda r: r["x.grad"],
                           lambda r: r["ref"]["x.grad"])] + [
        (f"grad of {p}", lambda r, p=p: r[f"{p}.grad"], lambda r, p=p: r["ref"][f"{p}.grad"])
        for p in ("ln1.weight", "ln1.bias", "ln2.weight", "ln2.bias")], F32_TOL)
    want = costs.tp_bytes_per_layer(B, S, H, t, dtype_bytes=4)
    for rank, r in enumerate(results):
        sent = sum(e[2] for e in r["forward"] + r["backward"])
        if not _close(torch.tensor(sent), torch.tensor(want), rtol=1e-12, atol=0):
            fail(f"the tracer counted {sent:,.0f} B sent over forward + backward, expected "
                 f"{want:,.0f} B", rank=rank, hint="4 all-reduces of the (B, T, C) activation")
    measured = sum(e[2] for e in results[0]["forward"] + results[0]["backward"])
    summary = {"b": B, "s": S, "h": H, "t": t, "dtype_bytes": 4, "measured": measured,
               "layer_bytes": float(layer_bytes(B, S, H, t, 4)), "costs": want}
    if not quiet:
        print(f"TPBlock OK on {t} ranks: output and gradients match the single-device layer; "
              f"rank 0 sent {measured:,.0f} B over forward + backward (b={B}, s={S}, h={H}, "
              f"float32) = layer_bytes = parlab.costs.tp_bytes_per_layer = {want:,.0f} B")
    return summary
