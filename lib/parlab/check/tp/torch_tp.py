r"""Module 02, exercise 9: `check_torch_tp(parallelize_tp, tp_loss)`, the tensor-parallel model of
this module with PyTorch's API (`parallelize_module`, `loss_parallel`), against one device and
against the collectives of the module's own TP.

The model (`parlab.tp.torch_model.SplitLM`): an embedding of V words, 2 blocks (the course's
`Block` with q, k and v as three Linears, 48 features, 12 heads), a final LayerNorm, a head
without bias; every parameter random, the same seed on every rank. Each rank builds it and a
1-D mesh of the world, calls the learner's `parallelize_tp(model, mesh)`, runs the model on
(2, 5) word ids and the learner's `tp_loss(logits, target)`, which computes the mean
cross-entropy under `loss_parallel()` and runs its backward. In the rank (plain data back,
`torch_tp_worker`): each parameter's kind, placements and local piece; every attention's
n_heads; the logits; the loss; every collective of the step, labelled with the part of the
model that made it and the pass (`parlab.tp.torch_measure.Regions`; parlab.comm sees DTensor's
functional collectives); every gradient.

Against, in the checking process: the same model on one device (`parlab.tp.torch_model.FusedLM`,
the fused qkv: the split is checked too) and F.cross_entropy. Each parameter a DTensor with the
placement of `torch_common.layout` (q, k, v, fc1, the head and the embedding Shard(0), proj and
fc2 Shard(1), their biases Replicate; LayerNorms whole) holding the rows torch.chunk gives the
rank; each attention told its n/t heads; the logits a DTensor Shard(-1) whose local piece is
the rank's columns of one device's logits; the loss; each gradient's local piece (rtol 1e-4,
atol 1e-5: float32, values of order 1 to 10, summation order only; a missing all-reduce or a
wrong head width moves them by 1e-2 and more); and the step's collectives equal, region by
region and byte for byte, to those of module 02's TP: one all-reduce of the (B, T, C)
activation into the embedding's output and out of each attention and MLP, three of one float32
per token in the loss (max, sum of exponentials, the target's logit: your exercise 8's), and
in backward one into each MLP, each attention and the head (f's).

A right answer does not depend on, and the tests vary: the world size and V, with V not a
multiple of t (visible: 3 ranks, V = 37: 13, 13 and 11 words; hidden: 2 ranks with V = 36, 18
each), the number of blocks (2: a plan for the first block only fails), the weights and the
words (seeded, random; targets 0 and V - 1 included).

In the ranks the course's own plans (`parlab.tp.torch_plans`) are refused. Under the verifier
every rank but 0 is handed NaN where it owns nothing (`torch_common.hide_unowned`).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F

from parlab.check._compare import assert_close, fail
from parlab.check._harness import CHECK_TIMEOUT_S, exercise, not_reexport, run_checked
from parlab.check.tp import torch_hints as H
from parlab.check.tp.torch_common import (
    check_grads,
    fail_layout,
    layout,
    layout_problem,
    piece,
    split_reference,
    tol,
)
from parlab.check.tp.torch_tp_worker import (
    HEADS,
    HIDDEN,
    LAYERS,
    SEED,
    B,
    S,
    inputs,
    run_rank,
    torch_references,
)

__all__ = ["check_torch_tp", "expected_calls", "reference"]

KEY_TORCH_TP = "02.torch_tp"
HANG = ("every rank must call parallelize_module with the same plan (it scatters each weight "
        "from rank 0) and run the same step")


def expected_calls(layers: int = LAYERS, *, act: int | None = None,
                   tokens: int = B * S) -> list[tuple[str, str, str, int]]:
    """(region, pass, kind, payload bytes) of one step of module 02's TP, in order."""
    a = act if act is not None else B * S * HIDDEN * 4  # the (B, T, C) float32 activation
    calls = [("embedding", "forward", "all_reduce", a)]
    for i in range(layers):
        calls += [(f"block {i} attention", "forward", "all_reduce", a),
                  (f"block {i} MLP", "forward", "all_reduce", a)]
    calls += [("loss", "forward", "all_reduce", tokens * 4)] * 3
    calls += [("head", "backward", "all_reduce", a)]
    for i in reversed(range(layers)):
        calls += [(f"block {i} MLP", "backward", "all_reduce", a),
                  (f"block {i} attention", "backward", "all_reduce", a)]
    return calls


def reference(vocab: int) -> tuple[torch.Tensor, float, dict]:
    """One device: the logits, the loss, and {SplitLM name: (value, gradient)}."""
    from parlab.tp.torch_model import make_lm

    lm, _ = make_lm(vocab, HIDDEN, HEADS, LAYERS, seed=SEED)
    idx, target = inputs(vocab)
    logits = lm(idx)
    loss = F.cross_entropy(logits.flatten(0, 1), target.flatten())
    loss.backward()
    return logits.detach(), float(loss.detach()), split_reference(lm)


def _grouped(calls: list) -> dict[tuple[str, str], list[tuple[str, int]]]:
    out: dict[tuple[str, str], list[tuple[str, int]]] = {}
    for region, phase, kind, n in calls:
        out.setdefault((region, phase), []).append((kind, int(n)))
    return out


def _describe(calls: list[tuple[str, int]]) -> str:
    return ", ".join(f"{kind} of {n:,} B" for kind, n in calls) or "none"


def check_calls(got: list, want: list, rank: int, *, hint: str = H.NO_PREPARE,
                yours: str = "TP's") -> None:
    """The step's collectives, region by region, against `want` (expected_calls); `hint`: the
    likely mistake when an attention made three times its calls (no PrepareModuleInput)."""
    if [tuple(c) for c in got] == want:
        return
    g, w = _grouped(got), _grouped(want)
    diff = [k for k in dict.fromkeys([*w, *g]) if g.get(k) != w.get(k)]
    lines = [f"{region} ({phase}): made {_describe(g.get((region, phase), []))}; expected "
             f"{_describe(w.get((region, phase), []))}" for region, phase in diff[:3]]
    more = f" (and {len(diff) - 3} more)" if len(diff) > 3 else ""
    tripled = [k for k in diff if k[0].endswith("attention")
               and len(g.get(k, [])) > len(w.get(k, []))]
    gathered = any(k[0] == "loss" and kind == "all_gather"
                   for k in diff for kind, _ in g.get(k, []))
    likely = hint if tripled else H.HEAD_NOT_SHARDED if gathered else H.PLAN
    fail(f"the step's collectives differ from your {yours}, by part of the model:\n  "
         + "\n  ".join(lines) + more, rank=rank, hint=likely)


def _value(loss: dict) -> float | None:
    local = loss.get("local")
    if isinstance(local, torch.Tensor) and local.numel() == 1:
        return float(local.double())
    value = loss.get("value")
    return float(value) if isinstance(value, (int, float)) else None


def _check_rank(res: dict, ref: tuple, t: int, rank: int) -> None:
    logits, loss, params = ref
    if not res["returned"]:
        fail(f"parallelize_tp returned {res['returned_kind']}, not the model", rank=rank,
             hint=H.RETURN)
    fail_layout(layout_problem(res["params"], res["n_heads"], t, HEADS), rank, res["unresolved"])
    for name, (value, _) in params.items():
        assert_close(res["params"][name]["local"], piece(value, layout(name), rank, t),
                     name=f"this rank's piece of {name}", rank=rank, rtol=0, atol=0,
                     hint="leave the values to parallelize_module: it scatters rank 0's weights")
    got = res["logits"]
    if got["kind"] != "DTensor" or got["placements"] not in (["Shard(2)"], ["Shard(-1)"]):
        fail(f"the logits are a {got['kind']} {got.get('placements', '')}, expected a DTensor "
             "Shard(-1)", rank=rank, hint=H.HEAD_LOCAL)
    assert_close(got["local"], piece(logits, "Shard(2)", rank, t), name="this rank's columns "
                 "of the logits", rank=rank, hint=H.PLAN, **tol(logits))
    value = _value(res["loss"])
    if value is None:
        fail(f"tp_loss returned a {res['loss']['kind']}, not the loss", rank=rank,
             hint="return the loss loss_parallel's cross-entropy gives (a DTensor)")
    assert_close(torch.tensor(value), torch.tensor(loss), name="the loss", rank=rank,
                 rtol=1e-5, atol=1e-6, hint="the mean cross-entropy over the B T tokens: "
                 "F.cross_entropy(logits.flatten(0, 1), target.flatten())")
    check_calls(res["calls"], expected_calls(), rank)


@exercise(KEY_TORCH_TP)
def check_torch_tp(parallelize_tp: Callable[..., Any], tp_loss: Callable[..., Any], *,
                   world_size: int = 3, vocab: int = 37, timeout: float = CHECK_TIMEOUT_S,
                   quiet: bool = False) -> list[tuple[str, str, str, int]]:
    """parallelize_tp and tp_loss on `world_size` ranks, V = `vocab` (module docstring).
    Returns rank 0's collectives: (region, pass, kind, payload bytes), in order."""
    for fn, name in ((parallelize_tp, "parallelize_tp"), (tp_loss, "tp_loss")):
        if getattr(fn, "__wrapped__", fn) in torch_references():
            from parlab.errors import reference_message

            fail(reference_message(H.TORCH_WHAT))
        not_reexport(fn, name=name)
    if HEADS % world_size:
        raise ValueError(f"world_size {world_size} must divide the {HEADS} heads")
    results = run_checked(run_rank, world_size, parallelize_tp, tp_loss, vocab,
                          what="parallelize_tp and tp_loss", timeout=timeout, hang_hint=HANG)
    ref = reference(vocab)
    for rank, res in enumerate(results):
        _check_rank(res, ref, world_size, rank)
    check_grads(results, ref[2], world_size, hint=H.PLAN, missing=H.NO_BACKWARD)
    calls = [tuple(c) for c in results[0]["calls"]]
    if not quiet:
        sent = sum(n for *_, n in calls)
        print(f"parallelize_tp and tp_loss on {world_size} ranks, V = {vocab}: every parameter "
              "sharded as planned, logits, loss and gradients match one device; "
              f"{len(calls)} collectives, the same as your TP's, part by part "
              f"({sent:,} B of payload per rank). Passed.")
    return calls
