r"""Module 01, exercise 4: `check_fully_shard(shard_model, full_grads)`, PyTorch's FSDP2 on a
stack of layers, with a reshard plan, against a single-device DDP step.

The model: Linear(8, 6), Tanh, Linear(6, 5), Tanh, Linear(5, 4) (hidden: other widths), float32,
every parameter randomised. Each rank builds it from the same seed and a mesh: 1-D (dp,), or
(dp, tp) whose mesh["dp"] it passes, so that the data-parallel ranks are not the world. The
learner's `shard_model(model, mesh, plan)` shards it; each rank feeds its own 3 rows and
backpropagates sum(y * u) for its own u. In the rank (plain data back): each parameter's type,
placements, mesh ranks and local piece; whether the root and each layer are FSDP units; the
collectives of forward and backward (parlab.comm, whose tracer sees FSDP2's all_gather_single
and reduce_scatter_single); which layers hold their gathered weights between forward and
backward (a layer's weight is a plain tensor then, a DTensor once resharded); the output;
each gradient's type and local piece; `full_grads(model)`; the local pieces after an SGD step.

Reference, in the checking process: the single-device model, the gradient averaged over the
rank's data-parallel group (DDP's step), one SGD step; rank r's piece of a parameter is the
rows torch.chunk gives it (`parlab.dp.dim0_rows`: ceil(R/d) rows, the last ranks fewer or
none); bytes per rank `parlab.dp.step_bytes` (each parameter padded to d ceil(R/d) rows, one
all-gather per layer in forward, again in backward for the layers the plan reshards, one
reduce-scatter each). Tolerance rtol=1e-5, atol=1e-6 (float32, summation order only).
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch import nn

import parlab.check._harness as harness
from parlab.check._compare import assert_close, fail
from parlab.check.fsdp import fully_shard_hints as H
from parlab.check.fsdp.common import not_the_course
from parlab.check.fsdp.fully_shard_worker import (
    LR,
    WIDTHS,
    fsdp2_references,
    inputs,
    make_model,
    run_rank,
)
from parlab.dp import dim0_rows, step_bytes

__all__ = ["check_fully_shard", "VISIBLE", "WIDTHS", "fsdp2_references"]

VISIBLE: dict[int, dict[str, Any]] = {  # world size -> the visible test's case; plans that
    # read differently reversed or inverted, so that neither mistake passes
    3: {"plan": (True, True, False)},  # rows 6, 5, 4 over 3: 2 2 2, 2 2 1, 2 2 0
    4: {"mesh_shape": (2, 2), "plan": (False, True, True)},  # mesh["dp"]: ranks [0,2], [1,3]
}


def dp_groups(world: int, mesh_shape: tuple[int, ...]) -> list[list[int]]:
    """The data-parallel groups: lines of arange(world).view(mesh_shape) along dim 0."""
    grid = torch.arange(world).view(*mesh_shape)
    return [line.tolist() for line in grid.movedim(0, -1).reshape(-1, mesh_shape[0])]


def _reference(widths: Sequence[int], world: int, mesh_shape: tuple[int, ...]) -> dict:
    """Per rank: y, and per parameter (full value, DDP-mean gradient over the rank's group)."""
    base = make_model(widths)
    out: dict[str, Any] = {"y": {}, "group": {}, "params": {}}
    for group in dp_groups(world, mesh_shape):
        model = copy.deepcopy(base)
        losses = []
        for q in group:
            x, u = inputs(widths, q)
            y = model(x)
            out["y"][q] = y.detach()
            losses.append((y * u).sum() / len(group))
        torch.stack(losses).sum().backward()
        for q in group:
            out["group"][q] = group
            out["params"][q] = {n: (p.detach(), p.grad) for n, p in model.named_parameters()}
    return out


def _piece(full: torch.Tensor, index: int, d: int) -> torch.Tensor:
    start, end = dim0_rows(full.shape[0], d)[index]
    return full[start:end]


def _check_params(res: dict, ref: dict, rank: int) -> None:
    group = ref["group"][rank]
    for name, (value, _) in ref["params"][rank].items():
        got = res["params"][name]
        if got["kind"] != "DTensor":
            fail(f"parameter {name} is a plain {got['kind']} of shape {tuple(got.get('shape', ()))}"
                 " after shard_model: the layers were not sharded", rank=rank, hint=H.SHARD)
        if got["mesh"] != group:
            fail(f"parameter {name} is sharded over ranks {got['mesh']}, the data-parallel "
                 f"mesh you were given holds {group}", rank=rank, hint=H.NO_MESH)
        if got["placements"] != ["Shard(0)"]:
            fail(f"parameter {name} has placements {got['placements']}, expected "
                 "['Shard(0)']", rank=rank, hint=H.REPLICATE)
        assert_close(got["local"], _piece(value, group.index(rank), len(group)),
                     name=f"this rank's piece of {name}", rank=rank, hint=H.SHARD)


def _check_units(res: dict, n_layers: int, rank: int) -> None:
    gathers = [c for c in res["forward"] if c[0] == "all_gather"]
    if res["root"] and not any(res["units"]):
        fail(f"the forward made {len(gathers)} all-gather(s) of {sum(c[1] for c in gathers):,}"
             f" B for {n_layers} layers, and every layer's weights stayed gathered until "
             "backward", rank=rank, hint=H.ROOT_ONLY)
    if not all(res["units"]):
        missing = [i for i, u in enumerate(res["units"]) if not u]
        fail(f"nn.Linear layers {missing} are not FSDP units of their own", rank=rank,
             hint=H.SHARD)
    if not res["root"]:
        fail("the model is not an FSDP module (fully_shard was not called on it)", rank=rank,
             hint=H.NO_ROOT)
    if len(gathers) != n_layers:
        fail(f"the forward made {len(gathers)} all-gathers, expected one per layer "
             f"({n_layers})", rank=rank, hint=H.SHARD)


def _check_plan(kept: list[bool], plan: Sequence[bool], rank: int) -> None:
    want = [not r for r in plan]
    if kept == want:
        return
    hint = H.INVERTED if kept == list(plan) else H.IGNORED if not any(kept) else \
        H.REVERSED if kept == want[::-1] else H.PLAN
    fail(f"between forward and backward, layers {[i for i, k in enumerate(kept) if k]} held "
         f"their gathered weights; the plan {list(plan)} keeps layers "
         f"{[i for i, k in enumerate(want) if k]}", rank=rank, hint=hint)


def _check_bytes(res: dict, shapes: list, plan: Sequence[bool], d: int, rank: int) -> None:
    names = [c[0] for c in res["backward"]]
    if "all_reduce" in names:
        fail(f"the backward made these collective calls: {names}", rank=rank,
             hint="FSDP2 reduce-scatters each layer's gradients: leave the gradients to it")
    model = step_bytes(shapes, d, plan)
    sent = sum(c[2] for c in res["forward"] + res["backward"])
    if abs(sent - model["total"]) > 1e-6 * model["total"]:
        fail(f"one step sent {sent:,.0f} B, expected {model['total']:,.0f} B (an all-gather "
             "per layer in forward, again in backward for the layers the plan reshards, a "
             "reduce-scatter per layer)", rank=rank, hint=PLAN_OR_UNITS)


PLAN_OR_UNITS = f"{H.SHARD}; {H.PLAN}"


def _check_grads(res: dict, ref: dict, rank: int) -> None:
    group = ref["group"][rank]
    index, d = group.index(rank), len(group)
    for name, (value, grad) in ref["params"][rank].items():
        got = res["grads"][name]
        if got["kind"] != "DTensor" or got["placements"] != ["Shard(0)"]:
            fail(f"{name}.grad is a {got['kind']} {got.get('placements', '')}, expected a "
                 "DTensor sharded Shard(0), as FSDP2 leaves it", rank=rank, hint=H.SHARD)
        assert_close(got["local"], _piece(grad, index, d), name=f"this rank's piece of "
                     f"{name}.grad", rank=rank, hint="FSDP2 reduce-scatters the mean of the "
                     "data-parallel ranks' gradients: " + H.SHARD)
        assert_close(res["after"][name], _piece(value - LR * grad, index, d),
                     name=f"this rank's piece of {name} after an SGD step", rank=rank,
                     hint="the optimizer steps the DTensor parameters: leave them as "
                     "fully_shard made them")


def _check_full(res: dict, ref: dict, rank: int) -> None:
    full = res["full"]
    if full.get("kind") != "dict":
        fail(f"full_grads(model) returned a {full.get('kind')}, expected a dict name -> "
             "tensor", rank=rank, hint=H.FULL)
    for name, (_, grad) in ref["params"][rank].items():
        got = full["items"].get(name)
        if got is None:
            fail(f"full_grads(model) has no entry {name!r}", rank=rank, hint=H.FULL)
        if got["kind"] == "DTensor":
            fail(f"full_grads(model)[{name!r}] is a DTensor, not a plain tensor", rank=rank,
                 hint=H.DTENSOR)
        local = _piece(grad, ref["group"][rank].index(rank), len(ref["group"][rank]))
        if got["kind"] == "Tensor" and tuple(got["shape"]) != tuple(grad.shape) and \
                tuple(got["shape"]) == tuple(local.shape):
            fail(f"full_grads(model)[{name!r}] has shape {tuple(got['shape'])}, the "
                 f"parameter {tuple(grad.shape)}", rank=rank, hint=H.LOCAL)
        assert_close(got.get("local"), grad, name=f"full_grads(model)[{name!r}]", rank=rank,
                     hint=H.FULL)


@harness.exercise("fully_shard")
def check_fully_shard(shard_model: Callable[..., Any], full_grads: Callable[..., Any], *,
                      world_size: int = 3, mesh_shape: tuple[int, ...] | None = None,
                      plan: Sequence[bool] = (True, True, False),
                      widths: Sequence[int] = WIDTHS, timeout: float = harness.CHECK_TIMEOUT_S,
                      quiet: bool = False) -> dict:
    """shard_model and full_grads on `world_size` ranks against a DDP step (module doc).
    Returns rank 0's {"measured": bytes sent, "model": step_bytes' total, "kept": layers}."""
    mesh_shape = tuple(mesh_shape or (world_size,))
    n_layers = len(widths) - 1
    if len(plan) != n_layers or int(torch.tensor(mesh_shape).prod()) != world_size:
        raise ValueError(f"plan {plan} must have {n_layers} flags and mesh {mesh_shape} "
                         f"{world_size} ranks")
    not_the_course(shard_model, "shard_model", fsdp2_references(), H.FSDP2_WHAT)
    results = harness.run_checked(
        run_rank, world_size, shard_model, full_grads, tuple(widths), mesh_shape, tuple(plan),
        what="shard_model", timeout=timeout, hang_hint="every rank must shard the same layers "
        "in the same order: fully_shard and each step's collectives are collective")
    ref = _reference(widths, world_size, mesh_shape)
    base = make_model(widths)
    shapes = [[tuple(p.shape) for p in m.parameters()] for m in base if isinstance(m, nn.Linear)]
    for rank, res in enumerate(results):
        if not res["returned"]:
            fail(f"shard_model returned {res['returned_kind']}, not the model", rank=rank,
                 hint=H.RETURN)
        _check_params(res, ref, rank)
        _check_units(res, n_layers, rank)
        assert_close(res["y"], ref["y"][rank], name="the output", rank=rank, hint=H.SHARD)
        _check_plan(res["kept"], plan, rank)
        _check_bytes(res, shapes, plan, len(ref["group"][rank]), rank)
        _check_grads(res, ref, rank)
        _check_full(res, ref, rank)
    sent = sum(c[2] for c in results[0]["forward"] + results[0]["backward"])
    if not quiet:
        print(f"shard_model on {world_size} ranks (mesh {mesh_shape}, plan {list(plan)}): "
              "DTensor parameters Shard(0) on the data-parallel mesh, outputs, gradients and an "
              f"SGD step match DDP; layers kept as planned; {sent:,.0f} B sent per rank, as "
              "step_bytes says. Passed.")
    return {"measured": sent, "kept": results[0]["kept"],
            "model": step_bytes(shapes, len(ref["group"][0]), plan)["total"]}
