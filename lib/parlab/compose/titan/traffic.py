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
  gradients' all-reduces) call the functional collectives, `torch.ops._c10d_functional.*`.
  `parlab.comm.dispatch.functional_trace`, a `TorchDispatchMode`, sees every one a rank runs
  (torch's own `CommDebugMode` counts the same calls, without their bytes;
  tests/test_titan.py holds the two to the same counts).

Both price a call as the ring algorithms of `parlab.costs` do: an all-reduce of n bytes over
t ranks sends $2\frac{t-1}{t}n$, an all-gather (of its output) and a reduce-scatter (of its
input) $\frac{t-1}{t}n$, an all-to-all $\frac{t-1}{t}n$, a send n. The tracer also wraps the
functional collectives' Python functions and marks those events `functional`: `step_traffic`
leaves them to the dispatch trace, so that no call is counted twice.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

import torch

from parlab import comm
from parlab.comm.dispatch import functional_trace

__all__ = ["Traffic", "step_traffic", "state_bytes", "local_bytes"]

@dataclass(frozen=True)
class Traffic:
    """Bytes one rank sent in one step, by road."""

    c10d: float  # torch.distributed's functions (parlab.comm's tracer)
    funcol: float  # DTensor's functional collectives (functional_trace)
    calls: int  # communication calls, both roads

    @property
    def total(self) -> float:
        return self.c10d + self.funcol


def step_traffic(step: Callable[[], Any]) -> Traffic:
    """Run `step()` once under both counters; what this rank sent."""
    with comm.trace() as tr, functional_trace() as fc:
        step()
    # a tracer that wraps the functional collectives too marks their events `functional`:
    # those are the counter's, so that no call is counted twice
    plain = [e for e in tr.events if not getattr(e, "functional", False)]
    return Traffic(sum(e.wire_bytes for e in plain), fc.wire_bytes(), len(plain) + len(fc.events))


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

