r"""Module 02, exercise 6: a tensor-parallel transformer layer, and the bytes it sends.

Reference: parlab.model.Block(48, 12) with every parameter randomised, LayerNorms included (a
fresh nn.LayerNorm, weight 1 and bias 0, would otherwise match the block's own), in float32:
output, input gradient and the LayerNorms' gradients, rtol=1e-5, atol=1e-4.

The bytes: a rank sends $4 \cdot 2\frac{t-1}{t}\,bsh\,e$ per layer, forward and backward, with
e bytes per element (e = 4 for the float32 used here; the course's $16\frac{t-1}{t}bsh$ is
e = 2, bf16). The tracer's count must equal `layer_bytes` and
`parlab.costs.tp_bytes_per_layer`; `layer_bytes` is also compared at sizes of every kind
(`parlab.check.tp.formula`), with the course's cost functions refused while it runs.

A right answer does not depend on, and the tests vary: the weights and LayerNorms (random),
the world size (visible 2, hidden 3 and 4), and for `layer_bytes` b, s, h, t (1 to 8, 3
included) and the bytes per element (1, 2 and 4), so that formulas agreeing at one point are
told apart. The layer's sizes are fixed (48, 12 heads): it is built from the classes of
exercises 2, 3 and 5, whose visible tests run other sizes (2) and an attention without its
mask (5).
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from parlab import costs
from parlab.check._compare import assert_close, fail
from parlab.check._harness import CHECK_TIMEOUT_S, call_learner, exercise, run_checked
from parlab.check.tp import hints
from parlab.check.tp.common import (
    F32_TOL,
    HEADS,
    SEED,
    B,
    Events,
    H,
    S,
    handed,
    prepare,
    run_module,
)
from parlab.check.tp.compare import close, compare, expect_events, got, ref, reject_reference
from parlab.check.tp.formula import Form, check_formula, cost_functions, refusing
from parlab.check.tp.keys import KEY_BLOCK, LAYERS

__all__ = ["check_tp_block"]
LNS = ("ln1.weight", "ln1.bias", "ln2.weight", "ln2.bias")
KEEP_LN = ("keep the block's own LayerNorms (self.ln1 = block.ln1, self.ln2 = block.ln2): "
           "their weight and bias are trained parameters; a new nn.LayerNorm starts at "
           "weight 1 and bias 0")
HALF = "count 4 all-reduces per layer: 2 in forward (g after attention and after the MLP) " \
    "and 2 in backward (their conjugates f)"
FORMS: list[Form] = [
    (HALF, lambda b, s, h, t, d: 4 * (t - 1) / t * b * s * h * d),
    ("a ring all-reduce of n bytes sends 2(t-1)/t * n per rank (a reduce-scatter and an "
     "all-gather), not (t-1)/t * n", lambda b, s, h, t, d: 4 * (t - 1) / t * b * s * h * d),
    ("bsh counts elements: multiply by dtype_bytes", lambda b, s, h, t, d: 8 * (t - 1) / t * b
     * s * h),
    ("multiply b*s*h by dtype_bytes once", lambda b, s, h, t, d: 8 * (t - 1) / t * b * s * h
     * d * d),
    ("each rank sends (t-1)/t of the data in each half of the ring, not all of it",
     lambda b, s, h, t, d: 8 * b * s * h * d),
    ("each half of the ring sends (t-1)/t of the data, not 1/t",
     lambda b, s, h, t, d: 8 / t * b * s * h * d),
    ("a layer makes 4 all-reduces of 2(t-1)/t * bsh * dtype_bytes each, not 8",
     lambda b, s, h, t, d: 16 * (t - 1) / t * b * s * h * d),
]


def _block_worker(cls: type, seed: int) -> dict:
    from parlab.model.transformer import Block

    rank, t, _, block, x, up, ref = prepare(lambda: Block(H, HEADS), seed)
    layout = {"attn.qkv": "heads", "attn.proj": "row", "mlp.fc1": "column", "mlp.fc2": "row"}
    return {"ref": ref, **run_module(cls, handed(block, layout, rank, t), x, up, rank, LNS)}


def _says(text: str) -> Callable[[Events], str]:
    return lambda events: text


def _check_layernorms(results: list[dict]) -> None:
    for rank, r in enumerate(results):
        for p in LNS:
            if not close(r[p], r["ref"][p], rtol=0, atol=0):
                fail(f"TPBlock's {p} is not the block's {p}", rank=rank, hint=KEEP_LN)


@exercise(KEY_BLOCK, needs=LAYERS)
def check_tp_block(cls: type, layer_bytes: Callable[..., float], *, world_size: int = 2,
                   seed: int = SEED, timeout: float = CHECK_TIMEOUT_S,
                   quiet: bool = False) -> dict:
    """TPBlock(block) against parlab.model.Block, and the bytes the tracer counts over
    forward + backward against layer_bytes(...) and parlab.costs.tp_bytes_per_layer."""
    reject_reference(cls, "TPBlock")
    check_formula(layer_bytes, call_name="layer_bytes", forms=FORMS, expect="a number of bytes",
                  right=lambda b, s, h, t, d: costs.tp_bytes_per_layer(b, s, h, t, d),
                  default_hint="4 all-reduces of b*s*h elements of dtype_bytes each, "
                               "2(t-1)/t per ring")
    t = world_size
    results = run_checked(_block_worker, t, cls, seed, what="TPBlock", timeout=timeout,
                          hang_hint=hints.HANG)
    _check_layernorms(results)
    compare(results, t, [("output", lambda r: r["y"], lambda r: r["ref"]["y"])], F32_TOL,
            hint="make the checks of TPMLP and TPAttention pass first; the layer adds only "
                 "replicated LayerNorms and residuals: x + attn(ln1(x)), then x + mlp(ln2(x))")
    for when, pointer in (("forward", "g after attention and after the MLP"),
                          ("backward", "f before attention and before the MLP")):
        why = f"a TP layer all-reduces exactly twice in its {when}: {pointer}"
        if when == "backward":
            why += ("; more than two: f applied again, on top of the one each "
                    "ColumnParallelLinear applies (in TPBlock.forward, TPAttention or TPMLP)")
        expect_events(results, when, "TPBlock", ["all_reduce", "all_reduce"], _says(why))
    compare(results, t, [(f"grad of {p}", got(f"{p}.grad"), ref(f"{p}.grad")) for p in LNS],
            F32_TOL, hint=hints.GRAD_HINT)
    compare(results, t, [("grad of x (the layer's input)", lambda r: r["x.grad"],
                          lambda r: r["ref"]["x.grad"])], F32_TOL, t_times=hints.EXTRA_F,
            hint=hints.GRAD_HINT)
    want = costs.tp_bytes_per_layer(B, S, H, t, dtype_bytes=4)
    for rank, r in enumerate(results):
        sent = sum(e[2] for e in r["forward"] + r["backward"])
        assert_close(torch.tensor(float(sent)), torch.tensor(want), rank=rank, rtol=1e-12,
                     atol=0, name="bytes the tracer counted over forward + backward",
                     hint="4 all-reduces of the (B, T, C) activation")
    measured = sum(e[2] for e in results[0]["forward"] + results[0]["backward"])
    with refusing(cost_functions()):
        formula = float(call_learner("layer_bytes", layer_bytes, B, S, H, t, 4))
    summary = {"b": B, "s": S, "h": H, "t": t, "dtype_bytes": 4, "measured": measured,
               "layer_bytes": formula, "costs": want}
    if not quiet:
        print(f"TPBlock OK on {t} ranks: output and gradients match the single-device layer; "
              f"rank 0 sent {measured:,.0f} B over forward + backward (b={B}, s={S}, h={H}, "
              f"float32) = layer_bytes = parlab.costs.tp_bytes_per_layer = {want:,.0f} B")
    return summary
