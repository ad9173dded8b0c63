"""What module 07's checks share: the references an answer may not use, the grids, the keys.

While a learner's function runs, the course's own answer refuses to run, with
`parlab.errors.reference_message(...)`, the message a bare re-export gets too:

- the rank grid (exercise 1): `parlab.mesh` and the planner (`grid_references`);
- the formulas (exercises 2 and 3 and the FP8 exercise: bytes per axis, state per GPU,
  micro-batches, FP8's bytes): every function of `parlab.costs`, `parlab.plan` and
  `parlab.mesh` (`formula_references`). These exercises
  allow plain arithmetic, `math` and `fractions`, nothing of parlab's;
- the capstone (exercise 4) adds `parlab.capstone`'s own loop and pieces (`parlab.check.capstone`).
"""

from __future__ import annotations

import types
from collections.abc import Callable
from typing import Any

__all__ = ["GRID_REFUSAL", "FORMULA_REFUSAL", "GRIDS", "KEYS", "grid_references",
           "formula_references"]

GRID_REFUSAL = ("parlab.mesh or parlab.plan (build the grid yourself: "
                "torch.arange(world_size).view(dp, pp, ep, cp, tp))")
FORMULA_REFUSAL = ("parlab.costs, parlab.plan or parlab.mesh (plain arithmetic, math and "
                   "fractions are fine)")
KEYS = {"axis_groups": "composition.axis_groups", "build_groups": "composition.build_groups",
        "placement": "composition.placement", "fit_state": "composition.fit_state",
        "tp_vs_pp": "composition.tp_vs_pp", "sync_gradients": "capstone.sync_gradients",
        "moe_groups": "composition.moe_groups", "moe_grads": "composition.moe_grads",
        "capstone": "capstone.train_dp_tp",
        "fp8": "composition.fp8"}  # exercise keys for parlab.check.exercise
GRIDS: list[tuple[int, dict[str, int]]] = [  # (world_size, sizes): the visible check uses 2
    (8, {"dp": 2, "pp": 2, "tp": 2}), (4, {"dp": 2, "tp": 2}),
    (12, {"dp": 3, "pp": 2, "tp": 2}), (16, {"dp": 2, "pp": 2, "ep": 2, "tp": 2}),
    (8, {"dp": 2, "cp": 2, "tp": 2}), (24, {"dp": 2, "pp": 3, "tp": 4}), (6, {"pp": 3, "tp": 2}),
    (48, {"dp": 2, "pp": 3, "ep": 2, "cp": 2, "tp": 2}), (1, {}),
    (12, {"dp": 4, "tp": 3}), (18, {"dp": 3, "tp": 6}), (20, {"dp": 5, "tp": 4}),
]


def grid_references() -> list[Callable[..., Any]]:
    """parlab.mesh's grid and groups, and the planner's functions that read them."""
    from parlab import mesh, plan
    from parlab.plan import costs as plan_costs

    return [mesh.make_mesh, mesh.new_groups, mesh.Mesh.groups, mesh.Mesh.group_of,
            mesh.Mesh.coords, plan_costs.nodes_spanned, plan_costs.axis_bytes, plan.evaluate,
            plan.plan]


def _defined_in(module: types.ModuleType) -> list[Callable[..., Any]]:
    return [v for v in vars(module).values()
            if isinstance(v, types.FunctionType) and v.__module__ == module.__name__]


def formula_references() -> list[Callable[..., Any]]:
    """Every function of parlab.costs, parlab.plan (costs, planner) and parlab.moe.costs, and
    the grid's: an answer that calls one of them computes nothing itself."""
    from parlab.costs import activations, closed_forms, memory, precision, roofline
    from parlab.cp import layout
    from parlab.moe import costs as moe_costs
    from parlab.plan import costs as plan_costs
    from parlab.plan import planner

    found = grid_references()
    for module in (closed_forms, memory, activations, precision, roofline, plan_costs, planner,
                   moe_costs):
        found += [f for f in _defined_in(module) if f not in found]
    return found + [layout.block_bytes]
