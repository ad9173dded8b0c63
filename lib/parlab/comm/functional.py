"""What a functional collective carries, for parlab.comm's tracer (`parlab.comm.tracer`).

PyTorch's DTensor (tensor-parallel plans, `loss_parallel`) does not call torch.distributed's
Python functions: it calls the *functional* collectives of
`torch.distributed._functional_collectives` (funcol), which return a new tensor and reach the
process group through `torch.ops._c10d_functional`. `parlab.comm.install()` wraps the funcol
functions that DTensor and `loss_parallel` call in torch 2.13 (`FUNCTIONAL`; here,
`install_functional`), looked up as `funcol.<name>` at call time, as DTensor looks them up.
Their events carry `functional=True` (`functional_fields`). `describe` reads one call:

- its group, given as a process group, a (mesh, dim) pair, a mesh or a list of ranks
  (funcol's RANK_TYPES), as the global ranks taking part (`funcol._expand_group`);
- its kind, named as the list forms are ("all_gather", "reduce_scatter"), so that a DTensor
  step and a step written with `dist.all_gather` / `dist.reduce_scatter` compare directly;
- its payload n as parlab.comm.bytes counts it: an all-gather's gathered tensor (the shard
  given times the group's size), a reduce-scatter's or an all-reduce's input;
- the bytes this rank sends under a ring (`parlab.comm.bytes.wire_bytes`); an uneven
  all_to_all_single counts what leaves the rank, as parlab.comm does.

Not seen: the coalesced forms, and `torch.ops._c10d_functional.*` called directly (graphs made
by torch.compile do that; eager DTensor in torch 2.13 does not).
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist

from parlab.comm.bytes import wire_bytes

__all__ = ["FUNCTIONAL", "Call", "describe", "functional_fields", "install_functional"]

FUNCTIONAL = {  # functions of torch.distributed._functional_collectives -> the kind reported
    "all_reduce": "all_reduce", "all_gather_single": "all_gather",
    "all_gather_tensor": "all_gather", "reduce_scatter_single": "reduce_scatter",
    "reduce_scatter_tensor": "reduce_scatter", "all_to_all_single": "all_to_all_single",
    "broadcast": "broadcast",
}

Call = tuple[str, tuple[int, ...], torch.Tensor, int, float]  # kind, ranks, tensor, n, wire


@functools.cache
def _signature(fn: Callable[..., Any]) -> inspect.Signature:
    return inspect.signature(fn)


def describe(name: str, fn: Callable[..., Any], args: tuple, kwargs: dict) -> Call:
    """(kind, global ranks of the group, the tensor given, payload n, wire bytes) of one call
    of funcol's `name` (the original function `fn`, called with args and kwargs)."""
    import torch.distributed._functional_collectives as funcol

    bound = _signature(fn).bind(*args, **kwargs).arguments
    ranks = tuple(int(r) for r in funcol._expand_group(bound["group"], bound.get("tag", ""))[1])
    size = len(ranks) or 1
    kind = FUNCTIONAL[name]
    tensor = bound["self"]
    n = tensor.numel() * tensor.element_size() * (size if kind == "all_gather" else 1)
    wire = wire_bytes(kind, n, size)
    splits = bound.get("input_split_sizes")
    if kind == "all_to_all_single" and splits and ranks:  # uneven: the rows that leave
        row_bytes = n // max(1, tensor.shape[0])
        wire = float(n - splits[ranks.index(dist.get_rank())] * row_bytes)
    return kind, ranks, tensor, n, wire


def functional_fields(name: str, fn: Callable[..., Any], args: tuple, kwargs: dict,
                      count: Callable[[str, tuple[int, ...]], int]) -> dict[str, Any]:
    """parlab.comm.Event's fields for one call of funcol's `name`; `count(kind, ranks)` gives
    its sequence number (parlab.comm's posted() counter)."""
    kind, ranks, tensor, n, wire = describe(name, fn, args, kwargs)
    return {"kind": kind, "group_size": len(ranks) or 1, "nbytes": n, "wire_bytes": wire,
            "group_ranks": ranks, "shape": tuple(tensor.shape),
            "dtype": str(tensor.dtype).replace("torch.", ""), "device": str(tensor.device),
            "seq": count(kind, ranks), "functional": True}


def install_functional(wrap: Callable[..., Callable[..., Any]],
                       originals: dict[str, Callable[..., Any]]) -> None:
    """Replace each function of FUNCTIONAL in funcol by `wrap(name, fn, functional=True)`,
    the original kept in `originals` under "funcol.<name>" (parlab.comm.install)."""
    import torch.distributed._functional_collectives as funcol

    for name in FUNCTIONAL:
        fn = getattr(funcol, name, None)
        if fn is not None:
            originals["funcol." + name] = fn
            setattr(funcol, name, wrap(name, fn, functional=True))
