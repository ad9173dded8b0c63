r"""Module 02, exercises 3 and 4: the tensor-parallel MLP, and the MLP in the other order.

Reference: parlab.model.MLP(48) (48 -> 192 -> 48) with every parameter randomised, in float32
like training: output, input gradient and the gradients of this rank's slices of fc1 and fc2,
rtol=1e-5, atol=1e-4 (values are of order 10; a different summation order moves an entry by
up to ~1e-5, a wrong shard or a missing all-reduce by ~1e-1). The tracer counts the collectives
of each pass. Wrong answers with a recognisable output are named: the MLP without its GeLU,
an output t times too large (a second g), the layers swapped (shapes that cannot multiply), a
bias added on every rank.

A right answer does not depend on, and the tests vary: the weights, biases, input and
upstream gradient (random), the world size (visible 2, hidden 3 and 4: 48 and 192 features
split 2, 3 and 4 ways). The MLP's sizes are fixed here (48 -> 192 -> 48): an MLP class holds
no size of its own, it takes its layers from exercise 2's classes, whose visible test runs
other sizes on 2 and 3 ranks.
"""

from __future__ import annotations

import copy
from typing import Any

import torch

from parlab.check._compare import fail
from parlab.check._harness import CHECK_TIMEOUT_S, exercise, run_checked
from parlab.check.tp import hints
from parlab.check.tp.common import (
    EXACT,
    F32_TOL,
    SEED,
    B,
    Events,
    H,
    S,
    backward,
    cpu,
    env,
    guard,
    handed,
    learner_mode,
    prepare,
    run_module,
    setup,
    traced,
)
from parlab.check.tp.compare import (
    bias_counted,
    close,
    compare,
    expect_events,
    got,
    kinds,
    part,
    reject_reference,
    times,
)
from parlab.check.tp.keys import KEY_MLP, KEY_ROW_FIRST, LINEARS

__all__ = ["check_tp_mlp", "check_row_first"]
PARAMS = ("fc1.weight", "fc1.bias", "fc2.weight", "fc2.bias")
COLUMN_ROW = {"fc1": "column", "fc2": "row"}  # what each rank owns of the MLP (`handed`)
NO_GELU = ("apply the GeLU to fc1's output before fc2, on each rank's slice: "
           "self.fc2(F.gelu(self.fc1(x)))")


def _swapped(t: int) -> str:
    return (f"fc1.weight has the shape of a row-parallel shard ({4 * H}, {H // t}) and fc2's "
            f"that of a column-parallel one ({H // t}, {4 * H}): the layers are swapped. "
            "fc1, the up-projection, must be ColumnParallelLinear(mlp.fc1) and fc2 "
            "RowParallelLinear(mlp.fc2): the column layer's sharded output is the row layer's "
            "input")


def _shape_hint(model: Any, t: int) -> str:
    """What to say when the learner's MLP raises a shape error: swapped layers, or the layout."""
    shapes = [tuple(getattr(getattr(model, n, None), "weight", torch.empty(0)).shape)
              for n in ("fc1", "fc2")]
    if t > 1 and shapes == [(4 * H, H // t), (H // t, 4 * H)]:
        return _swapped(t)
    return hints.LINEAR_LAYOUT


def _mlp_worker(cls: type, seed: int) -> dict:
    from parlab.model.transformer import MLP

    rank, t, _, mlp, x, up, ref = prepare(lambda: MLP(H), seed)
    if not learner_mode():
        with torch.no_grad():
            ref["y_no_gelu"] = cpu(mlp.fc2(mlp.fc1(x)))
    out = run_module(cls, handed(mlp, COLUMN_ROW, rank, t), x, up, rank, PARAMS,
                     shape_hint=lambda model: _shape_hint(model, t))
    return {"ref": ref, **out}


def _rows(r: dict, p: str, t: int) -> torch.Tensor:
    n = r["ref"][p].shape[0] // t
    return r["ref"][p][r["rank"] * n:(r["rank"] + 1) * n]


def _cols(r: dict, p: str, t: int) -> torch.Tensor:
    n = r["ref"][p].shape[1] // t
    return r["ref"][p][:, r["rank"] * n:(r["rank"] + 1) * n]


def _shard(r: dict, p: str, t: int) -> torch.Tensor:
    """This rank's slice of the reference's p (or p.grad): fc1 rows, fc2 columns, fc2.bias."""
    if p.startswith("fc1"):
        return _rows(r, p, t)
    return _cols(r, p, t) if p.startswith("fc2.weight") else r["ref"][p]


def _check_output(results: list[dict], t: int) -> None:
    for rank, r in enumerate(results):
        y, ref = r["y"], r["ref"]
        swapped = tuple(r["fc1.weight"].shape) == (4 * H, H // t) and t > 1
        if swapped and not close(y, ref["y"], **F32_TOL):
            fail(f"the output differs from the MLP's, and fc1.weight has shape "
                 f"{tuple(r['fc1.weight'].shape)}: a row-parallel shard (expected "
                 f"{(4 * H // t, H)})", rank=rank, hint=hints.ROW_FIRST)
        if bias_counted(y, ref["y"], ref["fc2.bias"], t):
            fail(f"the output is off by (t - 1) x fc2.bias = {t - 1} x fc2.bias", rank=rank,
                 hint=hints.BIAS_ONCE)
        c = times(y, ref["y"])
        if t > 1 and c is not None and abs(c - t) < 1e-3:
            fail(f"the output is exactly t = {t} times the MLP's", rank=rank, hint=hints.EXTRA_G)
        if close(y, ref["y_no_gelu"], **F32_TOL) and not close(y, ref["y"], **F32_TOL):
            fail("the output equals fc2(fc1(x)), the MLP without its GeLU", rank=rank,
                 hint=NO_GELU)
    compare(results, t, [("output", lambda r: r["y"], lambda r: r["ref"]["y"])], F32_TOL,
            hint="compare your forward with self.fc2(F.gelu(self.fc1(x))), fc1 a "
                 "ColumnParallelLinear of mlp.fc1 and fc2 a RowParallelLinear of mlp.fc2; "
                 "check_parallel_linears tests the two layers on their own")


@exercise(KEY_MLP, needs=LINEARS)
def check_tp_mlp(cls: type, *, world_size: int = 2, seed: int = SEED,
                 timeout: float = CHECK_TIMEOUT_S, quiet: bool = False) -> None:
    """TPMLP(mlp) against parlab.model.MLP in float32: output, grad of x and of all 4 params."""
    reject_reference(cls, "TPMLP")
    t = world_size
    results = run_checked(_mlp_worker, t, cls, seed, what="TPMLP", timeout=timeout,
                          hang_hint=hints.HANG)
    _check_output(results, t)

    def forward_hint(ev: list[tuple]) -> str:
        if len(ev) > 1:
            return f"{len(ev)} collectives counted in the forward: {hints.ROW_FIRST}"
        return "the forward needs exactly one all-reduce, g, after fc2 (of the (B, T, C) output)"

    expect_events(results, "forward", "TPMLP", ["all_reduce"], forward_hint)
    def shard(r: dict, key: str) -> torch.Tensor:
        return _shard(r, key, t)

    compare(results, t, [(p, got(p), part(shard, p)) for p in PARAMS], EXACT,
            hint=hints.LINEAR_LAYOUT)
    compare(results, t, [(f"grad of {p}", got(p + ".grad"), part(shard, p + ".grad"))
                         for p in PARAMS], F32_TOL, hint=hints.GRAD_HINT)
    compare(results, t, [("grad of x (the MLP's input)", lambda r: r["x.grad"],
                          lambda r: r["ref"]["x.grad"])], F32_TOL, t_times=hints.EXTRA_F,
            hint=hints.GRAD_HINT)
    expect_events(results, "backward", "TPMLP", ["all_reduce"], lambda ev: (
        hints.F_BACKWARD if not ev else f"{len(ev)} collectives in backward: " + hints.G_BACKWARD))
    if not quiet:
        print(f"TPMLP OK on {t} ranks: output and the gradients of x, fc1.weight, fc1.bias, "
              f"fc2.weight, fc2.bias match the single-device MLP (float32, "
              f"rtol={F32_TOL['rtol']:g}, atol={F32_TOL['atol']:g}); one all-reduce forward, "
              "one backward")


# --- exercise 4: row-parallel first ---------------------------------------------------------------

def _row_first_worker(cls: type, seed: int) -> dict:
    from parlab.model.transformer import MLP
    from parlab.tp.layers import TPMLP

    rank, t, dev = env()
    mlp, x, up, ref = setup(lambda: MLP(H), seed, dev)
    ref_fwd: Events = []
    ref_bwd: Events = []
    if not learner_mode():  # the reference's collectives, before the guard goes on
        reference = TPMLP.from_mlp(copy.deepcopy(mlp))  # column -> row
        y, ref_fwd = traced("parlab.tp.TPMLP", reference, x.clone().requires_grad_())
        ref_bwd = backward("parlab.tp.TPMLP", y, up, rank)
    guard()
    out = run_module(cls, handed(mlp, {"fc1": "row", "fc2": "row"}, rank, t), x, up, rank, ())
    return {"ref": ref, **out, "column_row": {"forward": ref_fwd, "backward": ref_bwd}}


@exercise(KEY_ROW_FIRST, needs=LINEARS)
def check_row_first(cls: type, *, world_size: int = 2, seed: int = SEED,
                    timeout: float = CHECK_TIMEOUT_S, quiet: bool = False) -> dict:
    """RowFirstMLP(mlp): fc1 row-parallel. Same output and input gradient as the MLP, and the
    tracer must count an all-reduce of the (B, T, 4C) pre-activation before any other
    collective of the forward. Returns rank 0's counts for both orders."""
    reject_reference(cls, "RowFirstMLP")
    t = world_size
    results = run_checked(_row_first_worker, t, cls, seed, what="RowFirstMLP",
                          timeout=timeout, hang_hint=hints.HANG)
    compare(results, t, [("output", lambda r: r["y"], lambda r: r["ref"]["y"]),
                         ("grad of x (the MLP's input)", lambda r: r["x.grad"],
                          lambda r: r["ref"]["x.grad"])], F32_TOL,
            hint="with fc1 row-parallel the forward is x -> f -> own_slice -> fc1 (its g "
                 "all-reduces the (B, T, 4C) pre-activation) -> GeLU -> f -> own_slice -> fc2")
    for rank, r in enumerate(results):
        ev = r["forward"]
        if len(ev) < 2 or ev[0][0] != "all_reduce" or ev[0][1][-1] != 4 * H:
            fail(f"the forward of RowFirstMLP made these collective calls: {kinds(ev)}; "
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
                      f"{sum(e[2] for e in ev):>6,.0f} B sent: {kinds(ev)}")
    return summary
