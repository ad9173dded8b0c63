"""The rank's half of `check_fully_shard` (module 01, exercise 4): build the mesh and the
model, call the learner's `shard_model` and `full_grads`, run one traced step, and send back
plain data only (types, placements, mesh ranks, local pieces, the calls made)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch import nn

import parlab.check._harness as harness
from parlab.check._compare import randomize_parameters
from parlab.check.fsdp import fully_shard_hints as H

__all__ = ["run_rank", "about", "make_model", "inputs", "fsdp2_references", "WIDTHS", "LR"]

MESH_NAMES = {1: ("dp",), 2: ("dp", "tp")}
WIDTHS = (8, 6, 5, 4)
N, LR, SEED = 3, 0.1, 4321  # rows per rank, SGD's step, the model's seed


def fsdp2_references() -> list[Any]:
    from parlab.dp import fsdp2

    return [fsdp2.shard_stack]


def make_model(widths: Sequence[int]) -> nn.Sequential:
    """Linear, Tanh, Linear, ..., Linear through `widths`, seeded, every parameter random."""
    torch.manual_seed(SEED)
    layers: list[nn.Module] = []
    for a, b in zip(widths[:-1], widths[1:], strict=True):
        layers += [nn.Linear(a, b), nn.Tanh()]
    model = nn.Sequential(*layers[:-1])
    randomize_parameters(model, seed=SEED + sum(widths))
    return model


def inputs(widths: Sequence[int], rank: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(700 + rank)
    return torch.randn(N, widths[0], generator=g), torch.randn(N, widths[-1], generator=g)


def _placement(p: Any) -> str:
    """'Shard(0)', 'Replicate()', 'Partial(sum)', whatever torch's own str() abbreviates."""
    return f"Shard({p.dim})" if p.is_shard() else "Replicate()" if p.is_replicate() else repr(p)


def about(t: Any) -> dict:
    """A parameter, gradient or returned value as data: its kind, and for a DTensor its
    placements, the ranks of its mesh, its global shape and this rank's local piece."""
    from torch.distributed.tensor import DTensor

    if isinstance(t, DTensor):
        return {"kind": "DTensor", "placements": [_placement(p) for p in t.placements],
                "mesh": [int(r) for r in t.device_mesh.mesh.flatten().tolist()],
                "shape": list(t.shape), "local": harness.cpu(t.to_local())}
    if isinstance(t, torch.Tensor):
        return {"kind": "Tensor", "shape": list(t.shape), "local": harness.cpu(t)}
    return {"kind": type(t).__name__}


def _calls(trace: Any) -> list[tuple[str, int, float, list[int]]]:
    from parlab.dp import measure

    return [(*call, list(e.group_ranks)) for call, e in
            zip(measure.calls(trace.events), trace.events, strict=True)]


def run_rank(shard_model: Callable[..., Any], full_grads: Callable[..., Any],
             widths: tuple[int, ...], mesh_shape: tuple[int, ...], plan: tuple[bool, ...]
             ) -> dict:
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import FSDPModule
    from torch.distributed.tensor import DTensor

    from parlab import comm

    rank, _, dev = harness.env()
    mesh = init_device_mesh(dev.type, mesh_shape, mesh_dim_names=MESH_NAMES[len(mesh_shape)])
    dp_mesh = mesh["dp"] if len(mesh_shape) > 1 else mesh
    model = make_model(widths).to(dev)
    linears = [m for m in model if isinstance(m, nn.Linear)]
    harness.refuse_in_rank(fsdp2_references(), H.FSDP2_WHAT)
    got = harness.call_learner("shard_model(model, mesh, plan)", shard_model, model, dp_mesh,
                               list(plan), hint=H.SHARD)
    out: dict[str, Any] = {"returned": got is model, "returned_kind": type(got).__name__,
                           "root": isinstance(model, FSDPModule),
                           "units": [isinstance(m, FSDPModule) for m in linears],
                           "params": {n: about(p) for n, p in model.named_parameters()}}
    if not all(v["kind"] == "DTensor" for v in out["params"].values()):
        return out  # not sharded: the checking process says so
    x, u = (t.to(dev) for t in inputs(widths, rank))
    with comm.trace() as forward:
        y = harness.call_learner("model(x)", model, x, hint=H.SHARD)
    out["kept"] = [not isinstance(m.weight, DTensor) for m in linears]
    with comm.trace() as backward:
        harness.call_learner("the backward pass", (y * u).sum().backward, hint=H.SHARD)
    out.update(y=harness.cpu(y), forward=_calls(forward), backward=_calls(backward),
               grads={n: about(p.grad) for n, p in model.named_parameters()})
    full = harness.call_learner("full_grads(model)", full_grads, model, hint=H.FULL)
    out["full"] = {"kind": "dict", "items": {str(k): about(v) for k, v in full.items()}} \
        if isinstance(full, dict) else {"kind": type(full).__name__}
    torch.optim.SGD(model.parameters(), lr=LR).step()
    out["after"] = {n: about(p).get("local") for n, p in model.named_parameters()}
    return out
