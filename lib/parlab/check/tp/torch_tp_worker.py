"""The rank's half of `check_torch_tp` (module 02, exercise 9): build the mesh and the model,
call the learner's `parallelize_tp` and `tp_loss`, run one step with every collective labelled
by the part of the model that made it, and send back plain data only (kinds, placements,
local pieces, the calls). What would make PyTorch crash later (a layer left replicated, styles
swapped, an attention not told its heads, logits that loss_parallel cannot take) is named
here first, with the same words the checking process uses on the data."""

from __future__ import annotations

import warnings
from collections.abc import Callable
from typing import Any

import torch

from parlab.check._harness import env, refuse_in_rank
from parlab.check.tp import torch_hints as H
from parlab.check.tp.common import learner_mode
from parlab.check.tp.torch_common import (
    about,
    call_api,
    fail_layout,
    hide_unowned,
    layout_problem,
)

__all__ = ["run_rank", "inputs", "torch_references", "HIDDEN", "HEADS", "LAYERS", "B", "S",
           "SEED"]

HIDDEN, HEADS, LAYERS, B, S, SEED = 48, 12, 2, 2, 5, 4545  # 12 heads: t = 2, 3, 4 all divide


def torch_references() -> list[Any]:
    """The course's own plans and loss (parlab.tp.torch_plans), refused while the answer runs."""
    from parlab.tp import torch_plans as P

    return [P.parallelize_tp, P.parallelize_sp, P.tp_block_plan, P.sp_block_plan, P.top_plan,
            P.parallel_loss]


def inputs(vocab: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(ids, targets), (B, S) each, seeded; the targets hold word 0 and word V - 1, the first
    and the last rank's ends of the vocabulary."""
    g = torch.Generator().manual_seed(SEED + vocab)
    idx = torch.randint(0, vocab, (B, S), generator=g)
    target = torch.randint(0, vocab, (B, S), generator=g)
    target[0, 0], target[-1, -1] = 0, vocab - 1
    return idx, target


def _logits_problem(logits: dict, t: int) -> tuple[str, str] | None:
    if logits["kind"] != "DTensor":
        return (f"model(idx) returned a plain {logits['kind']} of shape "
                f"{tuple(logits.get('shape', ()))}, not a DTensor of the logits", H.HEAD_LOCAL)
    if logits["placements"] not in (["Shard(2)"], ["Shard(-1)"]):
        return (f"the logits are a DTensor with placements {logits['placements']}, expected "
                "[Shard(-1)]: sharded over the vocabulary", H.HEAD_NOT_SHARDED)
    return None


def run_rank(parallelize_tp: Callable[..., Any], tp_loss: Callable[..., Any],
             vocab: int) -> dict:
    from torch.distributed.device_mesh import init_device_mesh

    from parlab.tp.torch_measure import Regions, lm_regions
    from parlab.tp.torch_model import make_lm

    rank, t, dev = env()
    mesh = init_device_mesh(dev.type, (t,))
    _, model = make_lm(vocab, HIDDEN, HEADS, LAYERS, seed=SEED, device=dev)
    if learner_mode():
        hide_unowned(model, [n for n, _ in model.named_parameters()], rank, t)
    refuse_in_rank(torch_references(), H.TORCH_WHAT)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        got = call_api("parallelize_tp(model, mesh)", parallelize_tp, model, mesh, hint=H.PLAN)
    unresolved = [str(w.message).splitlines()[0].split(" in module ")[0] for w in caught
                  if "could not be resolved" in str(w.message)]
    out: dict[str, Any] = {
        "returned": got is model, "returned_kind": type(got).__name__, "unresolved": unresolved,
        "params": {n: about(p) for n, p in model.named_parameters()},
        "n_heads": [int(getattr(b.attn, "n_heads", -1)) for b in model.blocks]}
    fail_layout(layout_problem(out["params"], out["n_heads"], t, HEADS), rank, unresolved)
    idx, target = (x.to(dev) for x in inputs(vocab))
    with Regions(lm_regions(model)) as seen:
        logits = call_api("model(idx)", model, idx, hint=H.PLAN)
        out["logits"] = about(logits)
        fail_layout(_logits_problem(out["logits"], t), rank)
        with seen.loss():
            loss = call_api("tp_loss(logits, target)", tp_loss, logits, target)
    out["loss"] = about(loss) if isinstance(loss, torch.Tensor) else {
        "kind": type(loss).__name__, "value": loss if isinstance(loss, (int, float)) else None}
    out["calls"] = [(c.region, c.phase, c.kind, c.nbytes) for c in seen.calls]
    out["grads"] = {n: about(p.grad) for n, p in model.named_parameters()}
    return out
