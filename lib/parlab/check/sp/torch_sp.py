r"""Module 03, exercise 6: `check_torch_sp(parallelize_sp)`, the TP + SP layer of this module
with PyTorch's API (`SequenceParallel`, `PrepareModuleInput`, `ColwiseParallel`,
`RowwiseParallel(output_layouts=Shard(1))`), against one device and against the collectives of
the module's own layer.

Two layers (`parlab.tp.torch_model.SplitBlock`: the course's `Block`, q, k and v as three
Linears, 48 features, 12 heads, no dropout), every parameter random, the same seed on every
rank. Each rank builds them and a 1-D mesh of the world, calls the learner's
`parallelize_sp(block, mesh)` on each, and runs its own T/t of the 12 tokens of 2 sequences
through both, then the backward of sum(y * u) for its rows of a random u. In the rank (plain
data back, `torch_sp_worker`): each parameter's kind, placements and local piece; every
attention's n_heads; the output rows and the input's gradient; every collective, labelled by
the part of the layer that made it and the pass; every gradient as DTensor left it.

Against, in the checking process: the same layers on one device (`parlab.model.Block`, the
fused qkv). Each parameter as `torch_common.sp_layout` says (TP's placements, the LayerNorms
Replicate() DTensors), holding the rows torch.chunk gives the rank; each attention told its
n/t heads; the output rows and the input gradient's (rtol 1e-4, atol 1e-5); each gradient by
its placement (a LayerNorm's is Partial: DTensor leaves the sum over ranks pending until
something reads it, so its pieces, summed over the ranks, must be the whole); and the
collectives equal, part by part and byte for byte, to your SPBlock's: in forward an all-gather
of the (B, T, C) activation into attention and into the MLP and a reduce-scatter out of each,
in backward the same two for each, in the reverse order.

A right answer does not depend on, and the tests vary: the world size (visible: 2 ranks, 6
tokens each; hidden: 3, 4 tokens each), the number of layers (2), the weights and inputs
(seeded).

In the ranks the course's own plans (`parlab.tp.torch_plans`) are refused. Under the verifier
every rank but 0 is handed NaN where it owns nothing (`torch_common.hide_unowned`).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from parlab.check._compare import assert_close, fail
from parlab.check._harness import CHECK_TIMEOUT_S, exercise, not_reexport, run_checked
from parlab.check.sp import torch_sp_hints as SH
from parlab.check.sp.torch_sp_worker import HEADS, HIDDEN, LAYERS, SEED, B, T, inputs, run_rank
from parlab.check.tp import torch_hints as H
from parlab.check.tp.torch_common import (
    check_grads,
    fail_layout,
    layout_problem,
    piece,
    sp_layout,
    split_reference,
    tol,
)
from parlab.check.tp.torch_tp import check_calls
from parlab.check.tp.torch_tp_worker import torch_references

__all__ = ["check_torch_sp", "expected_sp_calls"]

KEY_TORCH_SP = "03.torch_sp"
HANG = ("every rank must parallelize the same layers with the same plan (parallelize_module "
        "scatters each weight from rank 0) and run them on its own tokens")


def expected_sp_calls(layers: int = LAYERS, act: int = B * T * HIDDEN * 4
                      ) -> list[tuple[str, str, str, int]]:
    """(region, pass, kind, payload bytes) of one step of module 03's TP + SP layers."""
    calls = []
    for i in range(layers):
        for part in ("attention", "MLP"):
            calls += [(f"block {i} {part}", "forward", "all_gather", act),
                      (f"block {i} {part}", "forward", "reduce_scatter", act)]
    for i in reversed(range(layers)):
        for part in ("MLP", "attention"):
            calls += [(f"block {i} {part}", "backward", "all_gather", act),
                      (f"block {i} {part}", "backward", "reduce_scatter", act)]
    return calls


def _reference() -> tuple[torch.Tensor, torch.Tensor, dict]:
    """One device: y, x's gradient, {block parameter name: (value, gradient)}."""
    from parlab.tp.torch_model import make_lm

    lm, _ = make_lm(8, HIDDEN, HEADS, LAYERS, seed=SEED)
    x, up = inputs()
    x.requires_grad_()
    y = x
    for block in lm.blocks:
        y = block(y)
    (y * up).sum().backward()
    params = {name.removeprefix("blocks."): v for name, v in split_reference(lm).items()
              if name.startswith("blocks.")}
    return y.detach(), x.grad, params  # type: ignore[return-value]


def _check_rank(res: dict, ref: tuple, t: int, rank: int) -> None:
    y, x_grad, params = ref
    if not res["returned"]:
        fail(f"parallelize_sp returned {res['returned_kind']}, not the block", rank=rank,
             hint=H.RETURN)
    fail_layout(layout_problem(res["params"], res["n_heads"], t, HEADS, where=sp_layout,
                               replicated=SH.NORMS), rank, res["unresolved"])
    for name, (value, _) in params.items():
        assert_close(res["params"][name]["local"], piece(value, sp_layout(name), rank, t),
                     name=f"this rank's piece of {name}", rank=rank, rtol=0, atol=0,
                     hint="leave the values to parallelize_module: it scatters rank 0's weights")
    rows = piece(y, "Shard(1)", rank, t)
    assert_close(res["y"].get("local"), rows, name="this rank's tokens of the output",
                 rank=rank, hint=SH.PLAN, **tol(y))
    assert_close(res["x.grad"], piece(x_grad, "Shard(1)", rank, t), name="this rank's tokens "
                 "of the input's gradient", rank=rank, hint=SH.PLAN, **tol(x_grad))
    check_calls(res["calls"], expected_sp_calls(), rank, hint=SH.NO_PREPARE, yours="SPBlock's")


@exercise(KEY_TORCH_SP)
def check_torch_sp(parallelize_sp: Callable[..., Any], *, world_size: int = 2,
                   timeout: float = CHECK_TIMEOUT_S,
                   quiet: bool = False) -> list[tuple[str, str, str, int]]:
    """parallelize_sp on `world_size` ranks (module docstring). Returns rank 0's collectives:
    (region, pass, kind, payload bytes), in order."""
    if getattr(parallelize_sp, "__wrapped__", parallelize_sp) in torch_references():
        from parlab.errors import reference_message

        fail(reference_message(H.TORCH_WHAT))
    not_reexport(parallelize_sp, name="parallelize_sp")
    if HEADS % world_size or T % world_size:
        raise ValueError(f"world_size {world_size} must divide the {HEADS} heads and {T} tokens")
    results = run_checked(run_rank, world_size, parallelize_sp, what="parallelize_sp",
                          timeout=timeout, hang_hint=HANG)
    ref = _reference()
    for rank, res in enumerate(results):
        _check_rank(res, ref, world_size, rank)
    check_grads(results, ref[2], world_size, hint=SH.PLAN, missing=SH.PLAN)
    calls = [tuple(c) for c in results[0]["calls"]]
    if not quiet:
        print(f"parallelize_sp on {world_size} ranks: LayerNorms on sequence shards, every "
              "parameter sharded as planned, output rows and gradients match one device; "
              f"{len(calls)} collectives, the same as your SPBlock's, part by part "
              f"({sum(n for *_, n in calls):,} B of payload per rank). Passed.")
    return calls
