r"""Graded checks of module 07, exercise 3: the two practice problems, computed.

`fit_state(n_params, n_gpus, gpu_bytes, gpus_per_node)` (problem 1: a 70B model on 32 H100s)
and `tp_vs_pp(h, b, s, t, p, max_bubble)` (problem 2: TP bytes per layer against PP
micro-batches), compared with `parlab.costs` on the problem's numbers in the visible test and
on other models, clusters and bounds in the hidden one: bools and integers exactly, bytes to
1e-9. The hidden bubble bounds include exact cases, $(p-1)/(m+p-1) = x$ at a whole m, where a
float comparison rounds the wrong way.

While the learner's code runs, every function of parlab.costs, parlab.plan and parlab.mesh
refuses to run: the exercise is the arithmetic (`common.formula_references`).

A right answer must not depend on: for fit_state, whether plain DP fits (the visible test runs
problem 1, where it does not, and a 1.3B model where it does) or the node size (8 and 4
visible, 6 hidden); for tp_vs_pp, t, p, b and the sizes (TP 8, 2 and 4 visible, 3 and 6
hidden), or how max_bubble is written (a float such as 0.2 that lands exactly on the bound at
a whole m: p = 6 and p = 4 at 0.2 visible, where ceil() of a float quotient asks for one too
many at p = 4; more exact bounds hidden).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

from parlab import costs
from parlab.check._compare import expect_type, fail
from parlab.check._harness import call_learner, exercise, not_reexport
from parlab.check.composition.common import FORMULA_REFUSAL, KEYS, formula_references

__all__ = ["check_fit_state", "check_tp_vs_pp", "FIT_CASES", "TP_PP_CASES"]
FIT_CASES = [(70e9, 32, 80e9, 8), (1.3e9, 16, 40e9, 4), (13e9, 16, 80e9, 8),
             (175e9, 64, 40e9, 8), (7e9, 8, 24e9, 4), (405e9, 128, 141e9, 8),
             (30e9, 24, 96e9, 6), (2e9, 12, 32e9, 6)]
"""fit_state's cases: the visible test runs the first two, problem 1 (plain DP does not fit, 8
GPUs a node) and a 1.3B model on nodes of 4 that plain DP fits (16 P <= memory): an answer
that writes in False or 8 fails it. The hidden test runs all, one more that fits."""
TP_PP_CASES = [(8192, 1, 8192, 8, 8, 0.15), (4096, 2, 4096, 4, 4, 0.1),
               (12288, 1, 2048, 8, 16, 0.05), (5120, 4, 1024, 2, 6, 0.2),
               (6144, 3, 3072, 6, 5, 0.2), (2048, 2, 4096, 4, 4, 0.2),
               (3072, 1, 2048, 3, 7, 0.2), (1536, 2, 1024, 2, 13, 0.2), (4096, 1, 512, 4, 3, 0.1)]
VISIBLE_TP_PP = (0, 3, 5)
"""The visible test's cases: the problem's numbers (m = 40 and 20 inexact), and two bounds met
exactly at a whole m: p = 6, x = 0.2 (m = 20, v = 2: 10) and p = 4, x = 0.2 (m = 12, v = 2:
6), where ceil((p-1)(1-x)/(v x)) in floating point lands on 12.000000000000002 and asks for
one too many. The hidden test runs every case: p = 4 and 3 at x = 0.1, p = 7 and 13 at 0.2
(exact, and the float form errs again), p = 16 at 0.05."""
HINTS = {
    "replica_bytes": "one full replica holds 2 + 2 + 12 = 16 bytes per parameter",
    "dp_fits": "plain DP keeps a full replica on every GPU: it fits only if 16 P <= memory "
               "(return a bool)",
    "zero3_bytes": "ZeRO-3 shards all 16 bytes per parameter over every GPU: 16 P / n_gpus",
    "tp": "TP fills one node: t = gpus_per_node", "dp": "the nodes are the DP replicas",
    "tp_only_bytes": "TP alone divides the state by t only: 16 P / t, without ZeRO over DP",
    "allreduce_bytes": "a ring all-reduce sends 2 (t-1)/t of the b*s*h bf16 tensor (2 bytes)",
    "layer_bytes": "four all-reduces per layer: two forward, two backward",
    "m": "smallest m with (p-1)/(m+p-1) <= max_bubble",
    "m_interleaved": "with v = 2 chunks per rank the bubble is (p-1)/(2m+p-1): smallest m",
}
SLIPS = {  # key -> [(got / expected, what gives it)]
    "allreduce_bytes": [(0.5, "half of it: the reduce-scatter's (t-1)/t alone (a ring "
                              "all-reduce adds an all-gather: 2 (t-1)/t), or 1 byte per "
                              "element instead of bf16's 2")],
    "layer_bytes": [(0.5, "half of it: the forward's two all-reduces only, or 1 byte per "
                          "element instead of bf16's 2"),
                    (0.25, "one all-reduce's worth: a layer has four")],
    "replica_bytes": [(0.75, "12 bytes per parameter: the fp32 master weights are missing"),
                      (0.25, "4 bytes per parameter: the bf16 weights and gradients only; "
                             "Adam's fp32 state adds 12")],
}


def _same(got: dict, key: str, value: Any, label: str) -> None:
    if key not in got:
        fail(f"{label} has no key {key!r}", hint=f"return a dict with {key!r}: {HINTS[key]}")
    v = got[key]
    if isinstance(value, bool):
        ok = isinstance(v, bool) and v == value
    elif isinstance(value, int):
        ok = not isinstance(v, bool) and isinstance(v, (int, float)) and v == value
    else:
        ok = (not isinstance(v, bool) and isinstance(v, (int, float))
              and abs(v - value) <= 1e-9 * abs(value))
    if not ok:
        found = [text for r, text in SLIPS.get(key, ())
                 if isinstance(v, (int, float)) and value
                 and math.isclose(v / value, r, rel_tol=1e-9)]
        slip = None if not found else found[0] if len(found) == 1 else (
            "either " + ", or ".join(found))
        if key in ("m", "m_interleaved") and v == value + 1:
            slip = (f"m = {value} meets the bound exactly (the bubble equals max_bubble, and "
                    "the bound is <=), yet you asked for one more: either a float quotient "
                    "such as (p-1)(1-x)/x lands a hair above the whole number and ceil() "
                    "rounds it up (compare exactly with fractions.Fraction(repr(max_bubble)), "
                    "or test the bound m by m), or the bound is tested with < instead of <=")
        fail(f"{label}[{key!r}]: expected {value!r}, got {v!r}",
             hint=(f"{slip}. " if slip else "") + HINTS[key])


@exercise(KEYS["fit_state"])
def check_fit_state(fit_state: Callable[..., dict], *, quiet: bool = False) -> None:
    """fit_state(n_params, n_gpus, gpu_bytes, gpus_per_node) against parlab.costs."""
    not_reexport(fit_state, name="fit_state")
    for n, gpus, mem, per_node in FIT_CASES if quiet else FIT_CASES[:2]:
        label = f"fit_state({n:g}, {gpus}, {mem:g}, {per_node})"
        got = call_learner(label, fit_state, n, gpus, mem, per_node, refuse=formula_references(),
                           refusal=FORMULA_REFUSAL)
        expect_type(got, dict, name=label, what="a dict with the six keys of the exercise")
        replica = costs.training_state_bytes(n, "ddp", 1)
        want = {"replica_bytes": replica, "dp_fits": replica <= mem,
                "zero3_bytes": costs.training_state_bytes(n, "zero3", gpus),
                "tp": per_node, "dp": gpus // per_node, "tp_only_bytes": replica / per_node}
        for key, value in want.items():
            _same(got, key, value, label)
    if not quiet:
        print("fit_state OK on practice problem 1 (70B on 32 H100s) and on a 1.3B model that "
              "plain DP fits (16 GPUs, 4 a node)")


@exercise(KEYS["tp_vs_pp"])
def check_tp_vs_pp(tp_vs_pp: Callable[..., dict], *, quiet: bool = False) -> None:
    """tp_vs_pp(h, b, s, t, p, max_bubble) against parlab.costs."""
    not_reexport(tp_vs_pp, name="tp_vs_pp")
    # visible: the problem's numbers and bounds met exactly at a whole m (VISIBLE_TP_PP)
    cases = TP_PP_CASES if quiet else [TP_PP_CASES[i] for i in VISIBLE_TP_PP]
    for h, b, s, t, p, x in cases:
        label = f"tp_vs_pp(h={h}, b={b}, s={s}, t={t}, p={p}, max_bubble={x})"
        got = call_learner(label, tp_vs_pp, h, b, s, t, p, x, refuse=formula_references(),
                           refusal=FORMULA_REFUSAL)
        expect_type(got, dict, name=label, what="a dict with the four keys of the exercise")
        want = {"allreduce_bytes": costs.ring_allreduce_bytes(b * s * h * 2, t),
                "layer_bytes": costs.tp_bytes_per_layer(b, s, h, t),
                "m": costs.min_microbatches(p, x), "m_interleaved": costs.min_microbatches(p, x, 2)}
        for key, value in want.items():
            _same(got, key, value, label)
    if not quiet:
        print("tp_vs_pp OK on practice problem 2 (h = s = 8192, TP 8, PP 8)")
