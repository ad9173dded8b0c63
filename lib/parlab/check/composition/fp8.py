r"""Graded check of module 07, the FP8 exercise (section 5): what FP8 changes, computed.

`precision_costs(b, s, h, t, d, n_params, *, precision)` → a dict of six numbers, per GPU, for
precision "bf16" and "fp8", as module 07's text and `parlab.costs.precision` model them:

- "activations": a layer's bytes kept for backward under TP t with SP and selective
  recomputation (scores recomputed): $34\,sbh/t$ in bf16, $27\,sbh/t$ in FP8 (the GEMM inputs,
  14 of the 34, in 1 byte);
- "tp_all_gather", "tp_reduce_scatter": TP + SP as Megatron-LM runs it, forward and backward:
  a layer's six ring all-gathers (two forward; in backward the two LayerNorm outputs gathered
  again, which the $34\,sbh/t$ assumes, and the two output gradients; each a GEMM's input: 1
  byte in FP8, 2 in bf16) and four ring reduce-scatters (GEMM outputs, bf16 in both):
  $6\frac{t-1}{t}bsh \cdot x$ and $4\frac{t-1}{t}bsh \cdot 2$;
- "zero3_all_gather", "zero3_reduce_scatter": ZeRO-3 over d ranks, one pass: the weights
  gathered twice (forward, backward) in the GEMM's precision, the bf16 gradients
  reduce-scattered once: $2\frac{d-1}{d}P \cdot x$ and $\frac{d-1}{d}P \cdot 2$;
- "state": ZeRO-3's training state per GPU, $16P/d$ in both precisions (bf16 weights and
  gradients, fp32 master weights and Adam moments: the ZeRO paper's convention).

Compared with `parlab.costs` (`activation_bytes_per_layer`, `tp_bytes_by_collective`,
`fsdp_bytes_by_collective`, `training_state_bytes`) to 1e-9 relative: the visible test at one
layer of Llama 3 405B (TP 8, ZeRO-3 over 64) and at TP 3 × d 5; the hidden test at t = 1 and
d = 1 (nothing sent), at t = d = 2 and at random sizes (seeded). Any real number passes (int,
float, Fraction). While the learner's code runs, parlab.costs', plan's and mesh's functions
refuse to run (`common.formula_references`), and a failure names the likely mistake from the
ratio of what came back to what was expected (as `place._ratio_hint` does): every slip that
gives that ratio, joined by "either ... or"; in the FP8 call only the slips FP8 can cause,
since the bf16 call at the same point has passed. Expected and got are printed in one format,
with their ratio.

A right answer must not depend on: the sizes b, s, h (any, not powers of two), t and d (1, 2,
3, 8, 64, ...: the visible test runs TP 3 × d 5 beside TP 8 × d 64), P, the precision (both
are checked at every point), or the type of number returned (int, float, Fraction).

Until issue 44 the exercise asked for four TP all-gathers (the re-gathers left out): an answer
written then gets 2/3 of the all-gathers, and the hint says the exercise changed.
"""

from __future__ import annotations

import functools
import math
import numbers
import random
from collections.abc import Callable

from parlab import costs
from parlab.check._compare import expect_type, fail
from parlab.check._harness import call_learner, exercise, not_reexport
from parlab.check.composition.common import FORMULA_REFUSAL, KEYS, formula_references

__all__ = ["check_fp8", "FP8_POINTS", "FP8_KEYS"]
FP8_KEYS = ("activations", "tp_all_gather", "tp_reduce_scatter", "zero3_all_gather",
            "zero3_reduce_scatter", "state")
VISIBLE_POINTS = [(1, 8192, 16384, 8, 64, 405e9), (2, 1024, 4096, 3, 5, 7e9)]  # b s h t d P


def _hidden_points() -> list[tuple[int, int, int, int, int, float]]:
    rng = random.Random(33)
    points = [(1, 4096, 8192, 1, 16, 70e9), (2, 2048, 5120, 4, 1, 13e9),
              (3, 512, 1536, 1, 1, 1.5e9),  # TP 1, DP 1, both: nothing sent
              (4, 256, 2048, 2, 2, 3e9)]
    for _ in range(5):
        points.append((rng.randint(1, 4), rng.choice([512, 1000, 2048, 6000]),
                       rng.choice([1024, 2880, 4096, 12288]), rng.choice([2, 3, 6, 16, 64]),
                       rng.choice([2, 3, 7, 32, 128]), rng.choice([1.1e9, 8e9, 175e9])))
    return points


FP8_POINTS = VISIBLE_POINTS + _hidden_points()
HINTS = {
    "activations": "A layer keeps 34 sbh/t bytes under TP + SP with the scores recomputed; in "
                   "FP8 the GEMM inputs (LayerNorm outputs 4, out-proj input 2, fc2 input 8: "
                   "14 of the 34) take 1 byte instead of 2, so 27 sbh/t",
    "tp_all_gather": "Six ring all-gathers a layer (two forward; in backward each LayerNorm "
                     "output gathered again and the two output gradients), each sending "
                     "(t-1)/t of the gathered (b, s, h) GEMM input: 2 bytes an element in "
                     "bf16, 1 in FP8",
    "tp_reduce_scatter": "Four ring reduce-scatters a layer (two forward, two backward), each "
                         "sending (t-1)/t of a (b, s, h) GEMM output, which stays bf16 (2 "
                         "bytes) in both precisions",
    "zero3_all_gather": "The weights are gathered twice a pass (forward, then again for "
                        "backward), each sending (d-1)/d of P elements: 2 bytes in bf16, 1 "
                        "in FP8",
    "zero3_reduce_scatter": "The gradients are reduce-scattered once a pass, (d-1)/d of P "
                            "bf16 elements in both precisions",
    "state": "ZeRO-3 shards all 16 bytes a parameter over d (bf16 weights and gradients, fp32 "
             "master weights and Adam moments): 16 P/d in both precisions",
}
ONE_BYTE = "1 byte an element where bf16 takes 2"
CHANGED = ("the backward's two re-gathers of the LayerNorm outputs left out (four all-gathers, "
           "not six). Exercise 3c asked for four until the course corrected it: Megatron-LM "
           "keeps only the shard of each LayerNorm output, which is what makes 34 sbh/t, and "
           "gathers it again in backward")


def _slips(key: str, precision: str, *, t: int, d: int) -> list[tuple[float, str]]:
    """(got / expected, what gives it) for the mistakes this key can show. Under FP8 only the
    slips FP8 itself can cause: the bf16 call at the same point has passed, so a slip that
    would change bf16 too cannot be it."""
    fp8 = precision == "fp8"
    axis = key.split("_")[0]
    either: list[tuple[float, str]] = []  # slips of any precision: possible in bf16 only
    slips: list[tuple[float, str]] = []  # slips of FP8's own
    if axis in ("tp", "zero3"):
        n, name = (t, "t") if axis == "tp" else (d, "d")
        either.append((n / (n - 1) if n > 1 else math.inf,
                       f"(1 - 1/{name}) left out: a ring collective over {name} ranks sends "
                       f"({name}-1)/{name} of the tensor, not all of it"))
    if key.endswith("all_gather"):
        if fp8:
            slips.append((2.0, "bf16 all-gathers under FP8: the gathered tensor is a GEMM's "
                               "input, cast to FP8 before it is gathered"))
        else:
            either.append((0.5, ONE_BYTE))
    if key == "tp_all_gather":
        either += [(4 / 6, CHANGED),
                   (2 / 6, "the forward's two only: the backward gathers four times more")]
    if key == "zero3_all_gather":
        either.append((0.5, "the forward's gather only: the backward gathers the weights "
                            "again"))
    if key.endswith("reduce_scatter"):
        if fp8:
            slips.append((0.5, "the reduce-scatters in FP8 too: they sum GEMM outputs (or "
                               "gradients), which stay bf16, 2 bytes"))
        else:
            either.append((0.5, ONE_BYTE))
    if key == "tp_reduce_scatter":
        either.append((0.5, "the forward's two only: the backward reduce-scatters twice more"))
    if key == "zero3_reduce_scatter":
        either.append((2.0, "twice: the gradients are reduce-scattered once a pass"))
    if key == "activations":
        either.append((float(t), "not divided by t: with SP every region is split over t "
                                 "ranks"))
        if fp8:
            slips += [(17 / 27, "FP8 applied to all 34 sbh: only the GEMM inputs, 14 of the "
                                "34, take 1 byte"),
                      (34 / 27, "the bf16 count under FP8: 27 sbh, not 34")]
        else:
            either.append((0.5, ONE_BYTE))
    if key == "state":
        either.append((float(d), "not divided by d: ZeRO-3 shards the whole state"))
        if fp8:
            slips += [(15 / 16, "the weights or the gradients in FP8: both stay bf16 (each "
                                "GEMM casts its own FP8 copy)"),
                      (13 / 16, "the fp32 master weights in FP8: they stay fp32"),
                      (10 / 16, "Adam's moments in FP8: they stay fp32"),
                      (12 / 16, "Adam's moments in bf16 (DeepSeek-V3's choice, which the "
                                "course's planner does not make): fp32 here"),
                      (0.5, "the whole state in half its bytes: FP8 changes the GEMMs' "
                            "inputs, not the state")]
    found = slips if fp8 else either
    return [(r, text) for r, text in found if r != 1 and math.isfinite(r)]


def _sentence(text: str) -> str:
    return text[:1].upper() + text[1:] + ("" if text.endswith(".") else ".")


def _hint(key: str, got: float, want: float, precision: str, *, t: int, d: int) -> str:
    if want == 0:
        group = "t" if key.startswith("tp") else "d"
        return (f"With {group} = 1 there is no one to send to: (1 - 1/{group}) is 0. "
                + _sentence(HINTS[key]))
    ratio = got / want
    found = list(dict.fromkeys(text for r, text in _slips(key, precision, t=t, d=d)
                               if math.isclose(ratio, r, rel_tol=1e-9)))
    if not found:
        return _sentence(HINTS[key])
    cause = found[0] if len(found) == 1 else "either " + ", or ".join(found)
    return _sentence(cause) + " " + _sentence(HINTS[key])


def _bytes(x: float) -> str:
    """One format for expected and got: whole bytes with thousands separators."""
    return f"{x:,.0f}" if abs(x) >= 100 or x == int(x) else f"{x:,.4g}"


def _reference(b: int, s: int, h: int, t: int, d: int, n: float, precision: str
               ) -> dict[str, float]:
    tp = costs.tp_bytes_by_collective(b, s, h, t, precision=precision)
    fsdp = costs.fsdp_bytes_by_collective(n, d, precision=precision)
    return {"activations": costs.activation_bytes_per_layer(
                b, s, h, 1, t, sp=True, keep_scores=False, precision=precision),
            "tp_all_gather": tp["all-gather"], "tp_reduce_scatter": tp["reduce-scatter"],
            "zero3_all_gather": fsdp["all-gather"], "zero3_reduce_scatter": fsdp["reduce-scatter"],
            "state": costs.training_state_bytes(n, "zero3", d)}


def _compare(got: object, want: dict[str, float], label: str, precision: str, *, t: int,
             d: int) -> None:
    expect_type(got, dict, name=label, what=f"a dict with the keys {', '.join(FP8_KEYS)}")
    assert isinstance(got, dict)
    for key, value in want.items():
        if key not in got:
            fail(f"{label} has no key {key!r}", hint=f"Return a dict with {key!r}. "
                 + _sentence(HINTS[key]))
        v = got[key]
        if isinstance(v, bool) or not isinstance(v, numbers.Real):
            fail(f"{label}[{key!r}] is {v!r}, expected a number of bytes",
                 hint=_sentence(HINTS[key]))
        x = float(v)  # a Fraction too
        if abs(x - value) > 1e-9 * max(1.0, abs(value)):
            times = f" ({x / value:.4g} times the expected)" if value else ""
            fail(f"{label}[{key!r}]: expected {_bytes(value)} bytes, got {_bytes(x)}{times}",
                 hint=_hint(key, x, value, precision, t=t, d=d))


@exercise(KEYS["fp8"])
def check_fp8(precision_costs: Callable[..., dict], *, quiet: bool = False) -> None:
    """precision_costs(b, s, h, t, d, n_params, precision=...) against parlab.costs, in bf16
    then in FP8 at each point (the module docstring says what a right answer must not depend
    on)."""
    not_reexport(precision_costs, name="precision_costs")
    for b, s, h, t, d, n in FP8_POINTS[len(VISIBLE_POINTS):] if quiet else VISIBLE_POINTS:
        for precision in costs.PRECISIONS:
            label = f"precision_costs({b}, {s}, {h}, {t}, {d}, {n:g}, precision={precision!r})"
            call = functools.partial(precision_costs, precision=precision)
            got = call_learner(label, call, b, s, h, t, d, n, refuse=formula_references(),
                               refusal=FORMULA_REFUSAL)
            _compare(got, _reference(b, s, h, t, d, n, precision), label, precision, t=t, d=d)
    if not quiet:
        print("precision_costs OK in bf16 and FP8: one layer of Llama 3 405B (TP 8, ZeRO-3 "
              "over 64) and TP 3 × d 5")
