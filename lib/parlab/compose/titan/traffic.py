r"""What one training step costs a rank, for both builds: bytes sent and state held.

    traffic = step_traffic(lambda: titan_step(rep, 1, tokens))   # inside a rank
    traffic.c10d, traffic.funcol, traffic.total                   # bytes this rank sent
    held = state_bytes(rep.part.parameters(), rep.optimizer)      # weights + grads + Adam

PyTorch's parallel API talks over two roads, and one counter watches each:

- calls of `torch.distributed`'s functions (`all_reduce`, `all_gather_into_tensor`,
  `reduce_scatter_tensor`, `isend`, `batch_isend_irecv`, ...): the course's composed model
  makes only these, FSDP2 makes its all-gathers and reduce-scatters with them, pipelining its
  sends. The course's tracer (`parlab.comm.trace`) sees them all.
- DTensor's redistributions (TP's all-gathers and reduce-scatters, SP's, the Replicate
  gradients' all-reduces) call the functional collectives, `torch.ops._c10d_functional.*`,
  below those Python functions: the tracer does not see them. `FuncolCounter`, a
  `TorchDispatchMode`, sees every operator a rank runs and counts these (torch's own
  `CommDebugMode` counts the same calls, without their bytes; tests/test_titan.py holds
  the two to the same counts).

Both price a call as the ring algorithms of `parlab.costs` do: an all-reduce of n bytes over
t ranks sends $2\frac{t-1}{t}n$, an all-gather (of its output) and a reduce-scatter (of its
input) $\frac{t-1}{t}n$, an all-to-all $\frac{t-1}{t}n$, a send n. The two roads never carry
the same call, so their sum is what the rank sent (where the tracer also wraps the
functional collectives' Python functions, it marks those events `functional`, and
`step_traffic` leaves them to the counter).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from parlab import comm, costs

__all__ = ["FuncolCall", "FuncolCounter", "Traffic", "step_traffic", "state_bytes",
           "local_bytes"]

_PRICE = {  # functional collective -> (its ring formula, where its group's name is)
    "all_reduce": (costs.ring_allreduce_bytes, 2),
    "all_gather_into_tensor": (costs.ring_allgather_bytes, 2),
    "reduce_scatter_tensor": (costs.ring_reduce_scatter_bytes, 3),
    "all_to_all_single": (costs.all_to_all_bytes, 3),
}


@dataclass(frozen=True)
class FuncolCall:
    kind: str  # "all_gather_into_tensor", ...
    group_size: int
    nbytes: int  # the payload the formula prices: an all-gather's output, else its input
    wire_bytes: float


class FuncolCounter(TorchDispatchMode):
    """Every `_c10d_functional` collective this thread runs inside the block (the backward
    too: on CPU autograd runs it in the calling thread)."""

    def __init__(self) -> None:
        super().__init__()
        self.calls: list[FuncolCall] = []

    def __torch_dispatch__(self, func: Any, types: Any, args: tuple = (),
                           kwargs: dict | None = None) -> Any:
        from torch.distributed.tensor import DTensor

        if any(issubclass(t, DTensor) for t in types):
            # let DTensor dispatch it with this mode still on: the collectives that DTensor
            # runs inside an operator (a partial sum's all-reduce) would be missed otherwise
            return NotImplemented
        out = func(*args, **(kwargs or {}))
        packet = func.namespace == "_c10d_functional" and func.__name__.split(".")[0]
        if packet in _PRICE:
            import torch.distributed.distributed_c10d as c10d

            formula, at = _PRICE[packet]
            t = c10d._resolve_process_group(args[at]).size()
            tensor = out if packet == "all_gather_into_tensor" else args[0]
            n = tensor.numel() * tensor.element_size()
            self.calls.append(FuncolCall(packet, t, n, float(formula(n, t)) if t > 1 else 0.0))
        return out

    def wire_bytes(self) -> float:
        return sum(c.wire_bytes for c in self.calls)


@dataclass(frozen=True)
class Traffic:
    """Bytes one rank sent in one step, by road."""

    c10d: float  # torch.distributed's functions (parlab.comm's tracer)
    funcol: float  # DTensor's functional collectives (FuncolCounter)
    calls: int  # communication calls, both roads

    @property
    def total(self) -> float:
        return self.c10d + self.funcol


def step_traffic(step: Callable[[], Any]) -> Traffic:
    """Run `step()` once under both counters; what this rank sent."""
    with comm.trace() as tr, FuncolCounter() as fc:
        step()
    # a tracer that wraps the functional collectives too marks their events `functional`:
    # those are the counter's, so that no call is counted twice
    plain = [e for e in tr.events if not getattr(e, "functional", False)]
    return Traffic(sum(e.wire_bytes for e in plain), fc.wire_bytes(), len(plain) + len(fc.calls))


def local_bytes(t: torch.Tensor) -> int:
    """The bytes this rank stores of `t` (a DTensor's local shard)."""
    from torch.distributed.tensor import DTensor

    local = t.to_local() if isinstance(t, DTensor) else t
    return local.numel() * local.element_size()


def state_bytes(params: Iterable[torch.Tensor], optimizer: Any) -> dict[str, int]:
    """This rank's weights, gradients and optimizer state (after a step), in bytes."""
    params = list(params)
    moments = 0
    for state in optimizer.state.values():
        moments += sum(local_bytes(v) for v in state.values()
                       if isinstance(v, torch.Tensor) and v.dim() > 0)
    return {"weights": sum(local_bytes(p) for p in params),
            "grads": sum(local_bytes(p.grad) for p in params if p.grad is not None),
            "optimizer": moments}

