"""What module 06's checks share: the references an answer may not use, tolerances, hints.

While a learner's function runs (in this process through `call_learner(refuse=...)`, in a rank
through `refuse_in_rank`), every function of parlab's MoE reference raises CheckFailed with
`parlab.errors.reference_message(REFUSAL)`, the message a bare re-export gets too. The learner
may call torch and their own earlier answers; `ExpertShard` (given to exercises 3 and 4) is
theirs to use.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypedDict

import torch

__all__ = ["REFUSAL", "F64_TOL", "KEYS", "references", "story", "Tolerance"]



class Tolerance(TypedDict):
    rtol: float
    atol: float


REFUSAL = "parlab.moe (its router, capacity, dispatch or combine)"
F64_TOL: Tolerance = {"rtol": 1e-10, "atol": 1e-12}  # float64: only the summation order differs
KEYS = {"router": "moe.router", "capacity": "moe.capacity", "ep_moe": "moe.ep_moe",
        "ep_capacity": "moe.ep_capacity"}  # exercise keys for parlab.check.exercise


def references() -> list[Callable[..., Any]]:
    """Every function (and autograd Function) of parlab.moe that an answer could hand back."""
    from parlab import moe
    from parlab.moe import dispatch

    names = ["route", "balance_loss", "expert_capacity", "keep_mask", "queue_position",
             "moe_reference", "load_stats"]
    return ([getattr(moe, n) for n in names] + [moe.MoE.forward, dispatch.ep_moe,
            dispatch.ep_moe_capacity, dispatch.all_to_all, dispatch._exchange_counts,
            dispatch._run_local, dispatch.AllToAll.forward, dispatch.AllToAll.backward])


def story(got: Any, candidates: list[tuple[torch.Tensor, str]]) -> str | None:
    """The hint of the first wrong answer `got` equals (a known mistake reproduced), or None."""
    for wrong, hint in candidates:
        if isinstance(got, torch.Tensor) and got.shape == wrong.shape and torch.allclose(
                got.detach().double(), wrong.double(), rtol=1e-9, atol=1e-12):
            return hint
    return None
