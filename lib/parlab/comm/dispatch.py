"""Every functional collective a rank runs, seen at PyTorch's dispatcher.

    from parlab.comm.dispatch import functional_trace
    with functional_trace() as seen:                 # inside a rank
        dtensor.redistribute(mesh, [Replicate()])
    seen.events[0].kind, seen.wire_bytes()           # "all_gather_into_tensor", (t-1)/t n

DTensor's redistributions, `loss_parallel` and `context_parallel` talk through the functional
collectives, `torch.ops._c10d_functional.*`. `parlab.comm.trace()` sees the ones called
through `torch.distributed._functional_collectives` from Python (`parlab.comm.functional`);
`functional_trace()` sees every one that reaches the dispatcher, the ones made in C++ too,
through a `TorchDispatchMode` (as PyTorch's CommDebugMode does, which counts them without
their bytes). An op on DTensors is handed to DTensor first (NotImplemented), so that the
collectives it turns into, a partial sum's all-reduce inside an operator included, come back
here as ops on plain tensors. Kinds are named as torch.distributed's tensor forms
(all_gather_into_tensor, reduce_scatter_tensor, all_to_all_single, all_reduce, broadcast);
bytes as parlab.comm.bytes prices them (an all-gather's gathered output, else the input).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import torch.distributed as dist
from torch import Tensor
from torch.utils._python_dispatch import TorchDispatchMode

from parlab.comm.bytes import wire_bytes
from parlab.comm.tracer import Event, Trace

__all__ = ["functional_trace"]

# functional collective -> the torch.distributed name parlab.comm gives the same call
_KINDS = {"all_gather_into_tensor": "all_gather_into_tensor",
          "reduce_scatter_tensor": "reduce_scatter_tensor",
          "all_to_all_single": "all_to_all_single", "all_reduce": "all_reduce",
          "broadcast": "broadcast"}


def _group_ranks(name: Any) -> tuple[int, ...]:
    """Global ranks of the process group a functional collective names."""
    from torch.distributed.distributed_c10d import _resolve_process_group

    return tuple(dist.get_process_group_ranks(_resolve_process_group(name)))


class _FunctionalTrace(TorchDispatchMode):
    """Records every functional collective as a parlab.Event. An op on DTensors is
    handed to DTensor first (NotImplemented), so the collectives it turns into come back
    here as ops on plain tensors."""

    def __init__(self, record: Trace) -> None:
        super().__init__()
        self.record = record

    def __torch_dispatch__(self, func: Any, types: Any, args: tuple = (),
                           kwargs: dict | None = None) -> Any:
        from torch.distributed.tensor import DTensor

        if any(issubclass(t, DTensor) for t in types):
            return NotImplemented
        out = func(*args, **(kwargs or {}))
        kind = _KINDS.get(func.__name__.split(".")[0]) if func.namespace == "_c10d_functional" \
            else None
        if kind is not None:
            self.record.events.append(_event(kind, args, out))
        return out


def _event(kind: str, args: tuple, out: Tensor) -> Event:
    ranks = _group_ranks(args[-1])
    full = out if kind == "all_gather_into_tensor" else args[0]  # as parlab.comm counts it
    n = full.numel() * full.element_size()
    return Event(kind, len(ranks), n, wire_bytes(kind, n, len(ranks)), ranks,
                      tuple(full.shape), str(full.dtype).replace("torch.", ""),
                      str(full.device))


@contextlib.contextmanager
def functional_trace() -> Iterator[Trace]:
    """Record the functional collectives (DTensor's) this process makes inside the block,
    as a `parlab.Trace` (kinds named as torch.distributed's: all_gather_into_tensor,
    reduce_scatter_tensor, all_to_all_single, all_reduce)."""
    record = Trace()
    with _FunctionalTrace(record):
        yield record
