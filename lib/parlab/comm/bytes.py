"""What a communication call carries: its payload, and the bytes a rank sends for it under
the ring algorithms of `parlab.costs` (used by parlab.comm's tracer).

all_reduce 2(t-1)/t*n, all_gather and reduce_scatter (t-1)/t*n of the full tensor,
all_to_all (t-1)/t*n of the input, send n, recv 0.
"""

from __future__ import annotations

import functools
import inspect
from typing import Any

import torch
import torch.distributed.distributed_c10d as c10d

__all__ = ["payload", "wire_bytes"]


def _nbytes(t: torch.Tensor | None) -> int:
    return 0 if t is None else t.numel() * t.element_size()


def _first_tensor(x: Any) -> torch.Tensor | None:
    if isinstance(x, torch.Tensor):
        return x
    if isinstance(x, (list, tuple)) and x and isinstance(x[0], torch.Tensor):
        return x[0]
    return None


@functools.cache
def _leading(kind: str) -> tuple[str, ...]:
    """The names of the first two parameters of torch.distributed's `kind` (its tensors)."""
    fn = getattr(c10d, kind, None)
    try:
        return tuple(inspect.signature(fn).parameters)[:2] if fn is not None else ()
    except (TypeError, ValueError):  # pragma: no cover - a builtin without a signature
        return ()


def _two_tensors(kind: str, args: tuple, kwargs: dict) -> tuple[Any, Any]:
    """The call's first two arguments, given by position or by name: FSDP2 calls
    `reduce_scatter_single(output=..., input=...)`."""
    names = _leading(kind)
    given = [args[i] if len(args) > i else kwargs.get(names[i]) if len(names) > i else None
             for i in range(2)]
    if given[0] is None and not args and not names:
        given[0] = next(iter(kwargs.values()), None)
    return given[0], given[1]


def payload(kind: str, args: tuple, kwargs: dict) -> tuple[torch.Tensor | None, int]:
    """The tensor to describe and the payload bytes n used by the cost formulas."""
    a0, a1 = _two_tensors(kind, args, kwargs)
    if kind in ("all_gather", "reduce_scatter"):  # list forms: full = sum of the list
        full = a0 if kind == "all_gather" else a1
        if isinstance(full, (list, tuple)):
            return _first_tensor(full), sum(_nbytes(t) for t in full)
    if kind in ("all_gather_into_tensor", "all_gather_single"):  # (output, input): full = output
        return a0, _nbytes(a0)
    if kind in ("reduce_scatter_tensor", "reduce_scatter_single"):  # (output, input): full = input
        return a1, _nbytes(a1)
    if kind in ("all_to_all", "all_to_all_single"):  # (output, input): count the input
        t = a1 if kind == "all_to_all_single" else None
        if isinstance(a1, (list, tuple)):
            return _first_tensor(a1), sum(_nbytes(x) for x in a1)
        return t, _nbytes(t)
    t = _first_tensor(a0)
    return t, _nbytes(t)


# Which ring formula of parlab.costs gives the bytes a rank sends, per kind of call.
_WIRE = {
    "all_reduce": "ring_allreduce_bytes",
    "all_gather": "ring_allgather_bytes",
    "all_gather_into_tensor": "ring_allgather_bytes",
    "all_gather_single": "ring_allgather_bytes",
    "reduce_scatter": "ring_reduce_scatter_bytes",
    "reduce_scatter_tensor": "ring_reduce_scatter_bytes",
    "reduce_scatter_single": "ring_reduce_scatter_bytes",
    "all_to_all": "all_to_all_bytes",
    "all_to_all_single": "all_to_all_bytes",
    "broadcast": "broadcast_bytes",
}


def wire_bytes(kind: str, nbytes: int, group_size: int) -> float:
    """Bytes one rank sends for a call of `kind` with payload `nbytes` among `group_size`."""
    if kind in ("send", "isend"):
        return float(nbytes)
    formula = _WIRE.get(kind)
    if formula is None or nbytes == 0:
        return 0.0
    from parlab import costs  # imported here: costs is pure maths, comm is plumbing

    return float(getattr(costs, formula)(nbytes, group_size))
