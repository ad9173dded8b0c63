r"""What the module-01 checks share: the course's references they refuse, small helpers.

`dp_references()` lists parlab.dp.fsdp's FSDP code (the flat shard, the two collectives, the
autograd Function, the layer and the planner); `cost_references()` the parlab.costs functions
that compute module 01's answers. A check refuses them while the learner's code runs (in the
kernel with `call_learner(refuse=...)`, in a rank with `refuse_in_rank`), so a wrapper around
one gets the same message as a bare re-export (`not_the_course`).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch

from parlab.check._compare import fail
from parlab.check._harness import call_learner, cpu, env, not_reexport, refuse_in_rank
from parlab.errors import reference_message

__all__ = ["DP_WHAT", "PLAN_WHAT", "COSTS_WHAT", "ALL_REDUCE", "KIND", "dp_references",
           "plan_references", "cost_references", "not_the_course", "not_fsdp",
           "refuse_fsdp_in_rank", "call", "env", "cpu", "close", "kinds", "what"]

DP_WHAT = "parlab.dp.fsdp (the course's FSDP shards, collectives and layer)"
PLAN_WHAT = ("parlab.dp.fsdp's planner (plan_reshard, reshard_bytes) or "
             "parlab.costs.dp_traffic_bytes")
COSTS_WHAT = ("parlab.costs' state and traffic functions (training_state_bytes, "
              "state_breakdown, device_memory, dp_traffic_bytes)")
ALL_REDUCE = ("the gradients were all-reduced instead of reduce-scattered: an all-reduce sends "
              "2(d-1)/d of the gradient per rank and leaves every rank the whole sum, of which "
              "it keeps 1/d; dist.reduce_scatter sends (d-1)/d and leaves rank r its own shard")
KIND = {"all_gather_into_tensor": "all_gather", "all_gather_single": "all_gather",
        "reduce_scatter_tensor": "reduce_scatter", "reduce_scatter_single": "reduce_scatter"}


def dp_references() -> list[Any]:
    from parlab.dp import fsdp

    return [fsdp.shard_bounds, fsdp.take_shard, fsdp.gather_flat_params,
            fsdp.reduce_scatter_flat_grads, fsdp._FSDPLinearFn, fsdp.FSDPLinear]


def plan_references() -> list[Any]:
    from parlab import costs
    from parlab.dp import fsdp

    return [fsdp.reshard_bytes, fsdp.plan_reshard, costs.dp_traffic_bytes]


def cost_references() -> list[Any]:
    from parlab import costs

    return [costs.training_state_bytes, costs.state_breakdown, costs.device_memory,
            costs.dp_traffic_bytes]


def not_the_course(fn: Any, name: str, references: Sequence[Any], what: str) -> None:
    """Reject the course's own function or class handed back as the answer, or a subclass of
    one, with the refusal's message (a wrapper around it is refused with the same words when it
    runs)."""
    bases = getattr(fn, "__mro__", ())[1:]
    if (getattr(fn, "__wrapped__", fn) in references or fn in references
            or any(base in references for base in bases)):
        fail(reference_message(what))
    not_reexport(fn, name=name)


def not_fsdp(fn: Any, name: str) -> None:
    """`not_the_course` for parlab.dp.fsdp's shards, collectives and layer."""
    not_the_course(fn, name, dp_references(), DP_WHAT)


def refuse_fsdp_in_rank() -> None:
    """In a rank: parlab.dp.fsdp refused, with DP_WHAT's words, while the learner's code runs."""
    refuse_in_rank(dp_references(), DP_WHAT)


def call(stage: str, fn: Callable[..., Any], *args: Any, refs: Sequence[Any], what: str,
         hint: str | None = None) -> Any:
    """The learner's code, with `refs` refused (message: `what`) while it runs."""
    return call_learner(stage, fn, *args, hint=hint, refuse=refs, refusal=what)


def close(got: Any, ref: torch.Tensor, rtol: float = 1e-5, atol: float = 1e-6) -> bool:
    return (isinstance(got, torch.Tensor) and got.shape == ref.shape
            and bool(torch.allclose(got.double(), ref.double(), rtol=rtol, atol=atol)))


def what(x: Any) -> str:
    """'a tensor of shape (4,)' or 'a list': how a learner's answer reads in a message."""
    if isinstance(x, torch.Tensor):
        return f"a tensor of shape {tuple(x.shape)}"
    return f"a {type(x).__name__}"


def kinds(events: Sequence[Any]) -> list[tuple[str, float]]:
    """[(kind, wire bytes)] of traced events, the *_tensor / *_single forms named as lists."""
    return [(KIND.get(e.kind, e.kind), e.wire_bytes) for e in events]
