r"""Graded check of module 07, exercise 2: put each axis on the topology and price it.

`nodes_spanned(groups, gpus_per_node)` → the most nodes any one group touches (1: every group
stays inside a node, on NVLink), compared with `parlab.plan.nodes_spanned` on the groups of
every axis of several grids and node sizes, among them TP groups of 3 and 6 that do not fill a
node of 4 or 8 evenly (a group of ranks 6, 7, 8 straddles two nodes of 8).
`bytes_per_step(n_params, layers, hidden, seq, *, b, m, tp, pp, dp)` → {"tp", "pp", "dp"}: the
bytes one GPU sends per optimizer step on each axis of a dense model (no vocabulary, plain DDP,
TP with sequence parallelism whose GEMMs keep their gathered input, as module 03's block does,
1F1B), compared with `parlab.plan.axis_bytes(..., regather=False)` to 1e-9 on models whose
sizes are not all powers of two (TP 3, PP 5, DP 3):

$$V_\text{tp} = m \lceil L/p \rceil \cdot 16\tfrac{t-1}{t}\,bsh,\qquad
  V_\text{pp} = m \cdot 2 \cdot \frac{2bsh}{t}\ (p>1),\qquad
  V_\text{dp} = 2\tfrac{d-1}{d}\cdot 2\,\frac{P}{t}\frac{\lceil L/p \rceil}{L}$$ (bytes, bf16).
The stage priced is the fullest one, with $\lceil L/p \rceil$ of the L layers. (The planner
itself prices Megatron's SP, which gathers the LayerNorm outputs again in backward: 20, not
16; module 07's text says which is which.)

A right answer must not depend on: the node size (2, 4, 8), whether the groups' ranks are
consecutive or fill nodes evenly (the visible test runs TP 3 on nodes of 4 and 8), the axis
sizes (TP 3 × PP 5 × DP 3 beside TP 8), whether p divides L (ceil), or p = 1 and d = 1 (0).

While the learner's code runs, parlab.costs', parlab.plan's and parlab.mesh's functions refuse
to run (`common.formula_references`).
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable

from parlab.check._compare import fail
from parlab.check._harness import call_learner, exercise, not_reexport
from parlab.check.composition.common import FORMULA_REFUSAL, GRIDS, KEYS, formula_references

__all__ = ["check_placement", "MODELS", "NODE_SIZES"]
SPANS_HINT = ("a group's ranks r sit on node r // gpus_per_node; count the distinct nodes of "
              "each group and return the largest count")
BYTES_HINTS = {
    "tp": "TP sends 16 (t-1)/t · b s h bytes per layer (the bytes of four bf16 ring "
          "all-reduces: with SP two all-gathers and two reduce-scatters each way, the "
          "gathered inputs kept), for each of the ceil(L/p) layers of a stage and each of "
          "the m micro-batches",
    "pp": "PP sends one bf16 activation forward and one gradient backward per micro-batch; "
          "with sequence parallelism each TP rank sends its 1/t shard: m · 2 · 2bsh/t (0 when "
          "p = 1)",
    "dp": "DP all-reduces this rank's bf16 gradients once a step: 2 (d-1)/d · 2 bytes times "
          "the fullest stage's parameters over t, P/t · ceil(L/p)/L (0 when d = 1)",
}
NODE_SIZES = (2, 4, 8)
VISIBLE_GRIDS = [(8, {"dp": 2, "pp": 2, "tp": 2}), (12, {"dp": 4, "tp": 3})]
"""nodes_spanned's visible grids, each at every node size: one whose groups fill nodes evenly,
and TP 3, whose groups straddle nodes of 4 and 8 (ranks 3, 4, 5 on a node of 4)."""
MODELS = [  # n_params, layers, hidden, seq, b, m, tp, pp, dp
    (530e9, 105, 20480, 2048, 1, 240, 8, 8, 8), (70e9, 80, 8192, 4096, 1, 32, 8, 1, 4),
    (7e9, 32, 4096, 4096, 2, 4, 2, 2, 2), (175e9, 96, 12288, 2048, 1, 64, 4, 8, 16),
    (1e9, 24, 2048, 1024, 4, 1, 1, 1, 64), (20e9, 44, 6144, 2048, 1, 9, 3, 5, 3),
]


def _spans_reference(world: int, sizes: dict[str, int], axis: str, per_node: int) -> int:
    from parlab.mesh import make_mesh
    from parlab.plan.costs import nodes_spanned

    return nodes_spanned(make_mesh(world, **sizes), (axis,), per_node)


def _check_spans(nodes_spanned: Callable[[list, int], int], quiet: bool) -> None:
    from parlab.mesh import AXES, make_mesh

    cases = [(w, s, n) for w, s in GRIDS for n in NODE_SIZES if w > 1]
    visible = [(w, s, n) for w, s, n in cases if (w, s) in VISIBLE_GRIDS]
    for world, sizes, per_node in cases if quiet else visible:
        mesh = make_mesh(world, **sizes)
        for axis in AXES:
            groups = mesh.groups(axis)
            label = f"nodes_spanned({groups}, gpus_per_node={per_node})"
            got = call_learner(label, nodes_spanned, [list(g) for g in groups], per_node,
                               refuse=formula_references(), refusal=FORMULA_REFUSAL)
            want = _spans_reference(world, sizes, axis, per_node)
            if got != want:
                fail(f"{label}: expected {want}, got {got!r}", hint=SPANS_HINT)


def _bytes_reference(n: float, layers: int, hidden: int, seq: int, *, b: int, m: int, tp: int,
                     pp: int, dp: int) -> dict[str, float]:
    from parlab.plan.costs import axis_bytes
    from parlab.plan.types import Model, Shape

    model = Model("check", n, layers, hidden, math.lcm(tp, 8), seq)
    out = axis_bytes(model, Shape(dp, pp, 1, 1, tp), strategy="ddp", micro_batch=b,
                     microbatches=m, regather=False)  # SP keeping its gathered inputs
    return {axis: out[axis] for axis in ("tp", "pp", "dp")}


def _ratio_hint(axis: str, got: float, want: float, *, m: int, tp: int, layers: int,
                stage: int) -> str | None:
    """What a known slip gives: the ratio got / want says which (both, when two agree)."""
    if want == 0:
        return "this axis sends nothing here (its size is 1): return 0" if got else None
    slips = [
        (0.5, {"tp": "half of it: the forward's two all-reduces only (a layer has four, two "
                    "forward and two backward), or 1 byte per element instead of bf16's 2",
              "pp": "half of it: the forward activation only (the backward sends its gradient "
                    "back), or 1 byte per element instead of bf16's 2",
              "dp": "half of it: (d-1)/d of the gradients (a ring all-reduce sends 2 (d-1)/d), "
                    "or 1 byte per element instead of bf16's 2"}[axis]),
        (float(tp), "t times too much: with TP each rank holds (and sends) 1/t of it"),
        (1 / m, "one micro-batch's worth: multiply by the m micro-batches of a step"),
        (layers / stage, "every layer's worth: one GPU's stage holds only ceil(L/p) of them"),
    ]
    ratio = got / want
    found = list(dict.fromkeys(text for r, text in slips
                               if r != 1 and math.isclose(ratio, r, rel_tol=1e-9)))
    # two slips with the same ratio (m = 2 and half of it): name both
    return None if not found else found[0] if len(found) == 1 else (
        "either " + ", or ".join(found))


def _check_bytes(bytes_per_step: Callable[..., dict], quiet: bool) -> None:
    for n, layers, h, s, b, m, tp, pp, dp in MODELS if quiet else MODELS[:2] + MODELS[5:]:
        label = (f"bytes_per_step({n:g}, {layers}, {h}, {s}, b={b}, m={m}, tp={tp}, pp={pp}, "
                 f"dp={dp})")
        call = functools.partial(bytes_per_step, b=b, m=m, tp=tp, pp=pp, dp=dp)
        got = call_learner(label, call, n, layers, h, s, refuse=formula_references(),
                           refusal=FORMULA_REFUSAL)
        if not isinstance(got, dict):
            fail(f"{label} returned {type(got).__name__}, expected a dict with tp, pp, dp",
                 hint='return {"tp": ..., "pp": ..., "dp": ...}, bytes per GPU per step')
        want = _bytes_reference(n, layers, h, s, b=b, m=m, tp=tp, pp=pp, dp=dp)
        for axis, value in want.items():
            v = got.get(axis)
            if isinstance(v, bool) or not isinstance(v, (int, float)):
                fail(f"{label}[{axis!r}] is {v!r}, expected a number of bytes",
                     hint=BYTES_HINTS[axis])
            if abs(v - value) > 1e-9 * max(1.0, value):
                slip = _ratio_hint(axis, v, value, m=m, tp=tp, layers=layers,
                                   stage=math.ceil(layers / pp))
                fail(f"{label}[{axis!r}]: expected {value:.6g} bytes, got {v!r}",
                     hint=(f"{slip}. " if slip else "") + BYTES_HINTS[axis])


@exercise(KEYS["placement"])
def check_placement(nodes_spanned: Callable[[list, int], int],
                    bytes_per_step: Callable[..., dict], *, quiet: bool = False) -> None:
    """Both functions of exercise 2 against parlab.plan.costs."""
    not_reexport(nodes_spanned, name="nodes_spanned")
    not_reexport(bytes_per_step, name="bytes_per_step")
    _check_spans(nodes_spanned, quiet)
    _check_bytes(bytes_per_step, quiet)
    if not quiet:
        print("nodes_spanned and bytes_per_step OK: they agree with parlab's planner")
