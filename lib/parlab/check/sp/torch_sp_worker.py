"""The rank's half of `check_torch_sp` (module 03, exercise 6): build the mesh and two layers,
call the learner's `parallelize_sp` on each, run this rank's tokens through them forward and
backward with every collective labelled by the part of the layer that made it, and send back
plain data only. What would make PyTorch crash later (a layer left out, styles swapped, a
LayerNorm not on sequence shards, an attention not told its heads) is named here first."""

from __future__ import annotations

import warnings
from collections.abc import Callable
from typing import Any

import torch

from parlab.check._compare import fail
from parlab.check._harness import env, refuse_in_rank
from parlab.check.sp import torch_sp_hints as SH
from parlab.check.tp import torch_hints as H
from parlab.check.tp.common import learner_mode
from parlab.check.tp.torch_common import (
    about,
    call_api,
    fail_layout,
    hide_unowned,
    layout_problem,
    sp_layout,
)
from parlab.check.tp.torch_tp_worker import torch_references

__all__ = ["run_rank", "inputs", "HIDDEN", "HEADS", "LAYERS", "B", "T", "SEED"]

HIDDEN, HEADS, LAYERS, B, T, SEED = 48, 12, 2, 2, 12, 4546  # T, heads: t = 2, 3, 4 divide


def inputs() -> tuple[torch.Tensor, torch.Tensor]:
    """(x, the gradient from above), (B, T, C) each, seeded."""
    g = torch.Generator().manual_seed(SEED)
    return torch.randn(B, T, HIDDEN, generator=g), torch.randn(B, T, HIDDEN, generator=g)


def run_rank(parallelize_sp: Callable[..., Any]) -> dict:
    from torch.distributed.device_mesh import init_device_mesh

    from parlab.tp.torch_measure import Regions
    from parlab.tp.torch_model import make_lm

    rank, t, dev = env()
    mesh = init_device_mesh(dev.type, (t,))
    blocks = make_lm(8, HIDDEN, HEADS, LAYERS, seed=SEED, device=dev)[1].blocks
    if learner_mode():
        hide_unowned(blocks, [n for n, _ in blocks.named_parameters()], rank, t)
    refuse_in_rank(torch_references(), H.TORCH_WHAT)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        got = [call_api(f"parallelize_sp(blocks[{i}], mesh)", parallelize_sp, block, mesh,
                        hint=SH.PLAN, by_error=SH.error_hint)
               for i, block in enumerate(blocks)]
    unresolved = [str(w.message).splitlines()[0].split(" in module ")[0] for w in caught
                  if "could not be resolved" in str(w.message)]
    out: dict[str, Any] = {
        "returned": all(g is b for g, b in zip(got, blocks, strict=True)),
        "returned_kind": type(got[0]).__name__, "unresolved": unresolved,
        "params": {n: about(p) for n, p in blocks.named_parameters()},
        "n_heads": [int(getattr(b.attn, "n_heads", -1)) for b in blocks]}
    fail_layout(layout_problem(out["params"], out["n_heads"], t, HEADS, where=sp_layout,
                               replicated=SH.NORMS), rank, unresolved)
    n = T // t
    x, up = (z[:, rank * n:(rank + 1) * n].to(dev) for z in inputs())
    leaf = x.clone().requires_grad_()
    regions: dict[str, Any] = {}
    for i, block in enumerate(blocks):
        regions[f"block {i} attention"], regions[f"block {i} MLP"] = block.attn, block.mlp
    with Regions(regions) as seen:
        y = leaf * 1.0
        for i, block in enumerate(blocks):
            y = call_api(f"blocks[{i}] on this rank's tokens", block, y, hint=SH.PLAN,
                         by_error=SH.error_hint)
        out["y"] = about(y)
        if out["y"]["kind"] != "Tensor" or tuple(y.shape) != tuple(x.shape):
            fail(f"the layers returned a {out['y']['kind']} of shape "
                 f"{tuple(out['y'].get('shape', ()))}, expected this rank's tokens, a plain "
                 f"tensor of shape {tuple(x.shape)}", rank=rank, hint=SH.OUTPUT)
        call_api("the backward pass", (y * up).sum().backward, hint=SH.PLAN,
                 by_error=SH.error_hint)
    out["x.grad"] = leaf.grad.detach().cpu() if leaf.grad is not None else None
    out["calls"] = [(c.region, c.phase, c.kind, c.nbytes) for c in seen.calls]
    out["grads"] = {n: about(p.grad) for n, p in blocks.named_parameters()}
    return out
