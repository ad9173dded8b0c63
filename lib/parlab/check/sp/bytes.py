r"""Module 03, exercise 4: the bytes of a TP + SP layer.

`sp_layer_bytes(b, s, h, t, dtype_bytes)` must return, per kind of collective, the bytes one
rank sends per layer over forward and backward: $4\frac{t-1}{t}bsh\,e$ each, e bytes per
element (`parlab.tp.sp_bytes_per_layer`), at sizes of every kind, with the course's cost
functions refused while it runs (`parlab.check.tp.formula`). Then the tracer's sums over
forward + backward of the learner's `SPBlock`, by kind, and of parlab.tp.TPBlock (plain TP,
run before the guard) for the same layer, against the formula and against
`parlab.costs.tp_bytes_per_layer` (e = 4: the check runs in float32).

The formula is the learner's block's: its GEMMs keep the gathered input for backward, so it
sends plain TP's bytes; Megatron-LM's layer keeps only the shards and gathers them again,
6 all-gathers (`sp_bytes_per_layer(..., regather=True)`; module 03, section 6). A right answer
must not depend on b, s, h (several sizes), t (1 to 8 in the formula; 2 and 3 ranks visible, 4
hidden, for the tracer), or dtype_bytes (1, 2 and 4).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

from parlab import costs
from parlab.check._compare import expect_type, fail
from parlab.check._harness import CHECK_TIMEOUT_S, call_learner, exercise, run_checked
from parlab.check.sp.block import block_worker
from parlab.check.sp.common import HANG, KEY_BYTES, LAYER, P_DROP, B, H, T, reject_reference
from parlab.check.tp.formula import Form, check_formula, cost_functions, refusing

__all__ = ["check_sp_bytes"]


def _each(n: Callable[[int, int, int, int, int], float]) -> Callable[..., dict[str, float]]:
    """A wrong formula that gives the same bytes for both kinds."""
    return lambda b, s, h, t, d: {"all_gather": n(b, s, h, t, d),
                                  "reduce_scatter": n(b, s, h, t, d)}


FORMS: list[Form] = [
    ("count 4 of each per layer: 2 in forward (into and out of attention and the MLP) and 2 in "
     "backward (their conjugates)", _each(lambda b, s, h, t, d: 2 * (t - 1) / t * b * s * h * d)),
    ("one ring all-gather or reduce-scatter of n bytes sends (t-1)/t * n per rank: half of an "
     "all-reduce's 2(t-1)/t * n", _each(lambda b, s, h, t, d: 8 * (t - 1) / t * b * s * h * d)),
    ("bsh counts elements: multiply by dtype_bytes",
     _each(lambda b, s, h, t, d: 4 * (t - 1) / t * b * s * h)),
    ("each rank sends (t-1)/t of the data, not all of it",
     _each(lambda b, s, h, t, d: 4 * b * s * h * d)),
    ("each rank sends (t-1)/t of the data, not 1/t",
     _each(lambda b, s, h, t, d: 4 / t * b * s * h * d)),
]


def _measured(res: dict, kinds: list[str]) -> dict[str, float]:
    events = res[P_DROP]["forward"] + res[P_DROP]["backward"]
    return {k: sum(e[2] for e in events if e[0] == k) for k in kinds}


@exercise(KEY_BYTES, needs=LAYER)
def check_sp_bytes(cls: type, layer_bytes: Callable[..., Any], *, world_size: int = 2,
                   seed: int = 1234, timeout: float = CHECK_TIMEOUT_S,
                   quiet: bool = False) -> dict:
    """The tracer's bytes over forward + backward of SPBlock, by kind, against layer_bytes and
    against plain TP's (parlab.tp.TPBlock, same layer). Returns rank 0's numbers."""
    from parlab.tp.sequence import sp_bytes_per_layer

    reject_reference(cls, "SPBlock")
    check_formula(layer_bytes, call_name="sp_layer_bytes", forms=FORMS,
                  right=lambda b, s, h, t, d: sp_bytes_per_layer(b, s, h, t, dtype_bytes=d),
                  expect="a dict with keys 'all_gather' and 'reduce_scatter' (bytes one rank "
                         "sends per layer, forward + backward)",
                  default_hint="4 collectives of each kind, of b*s*h elements of dtype_bytes "
                               "each, (t-1)/t per ring")
    t = world_size
    results = run_checked(block_worker, t, cls, seed, True, what="SPBlock", timeout=timeout,
                          hang_hint=HANG)
    with refusing(cost_functions()):
        got = call_learner("sp_layer_bytes", layer_bytes, B, T, H, t, 4)
    expect_type(got, dict, name=f"sp_layer_bytes(b={B}, s={T}, h={H}, t={t}, dtype_bytes=4)",
                what="a dict with keys 'all_gather' and 'reduce_scatter'")
    formula = {k: float(v) for k, v in got.items()}
    tp_total = costs.tp_bytes_per_layer(B, T, H, t, dtype_bytes=4)
    for rank, res in enumerate(results):
        measured = _measured(res, list(formula))
        for kind, value in formula.items():
            if not math.isclose(measured[kind], value, rel_tol=1e-12):
                fail(f"the tracer counted {measured[kind]:,.0f} B of {kind} over forward + "
                     f"backward of SPBlock, expected {value:,.0f} B", rank=rank,
                     hint="make check_sp_block pass first: 2 all-gathers and 2 reduce-scatters "
                          "of the (B, T, C) activation each way")
        if not math.isclose(res["tp_bytes"], tp_total, rel_tol=1e-12) or not math.isclose(
                sum(measured.values()), res["tp_bytes"], rel_tol=1e-12):
            fail(f"TP + SP sent {sum(measured.values()):,.0f} B, plain TP {res['tp_bytes']:,.0f}"
                 f" B; both should be {tp_total:,.0f} B", rank=rank,
                 hint="an all-reduce is a reduce-scatter then an all-gather: the same bytes")
    summary = {"b": B, "s": T, "h": H, "t": t, "dtype_bytes": 4, "tp": results[0]["tp_bytes"],
               "sp": _measured(results[0], list(formula)), "formula": formula,
               "costs": tp_total}
    if not quiet:
        print(f"bytes OK on {t} ranks (b={B}, s={T}, h={H}, float32): rank 0 sent "
              f"{summary['sp']['all_gather']:,.0f} B in all-gathers + "
              f"{summary['sp']['reduce_scatter']:,.0f} B in reduce-scatters = "
              f"{sum(summary['sp'].values()):,.0f} B under TP + SP, and {summary['tp']:,.0f} B "
              "in all-reduces under plain TP")
    return summary
