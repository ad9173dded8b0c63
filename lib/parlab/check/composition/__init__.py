"""Graded checks of module 07, "Composition"; the notebook calls them as
`from parlab.check import composition as compcheck; compcheck.check_axis_groups(axis_groups)`.

- `groups`: exercise 1, the rank grid (`check_axis_groups`) and its process groups on ranks
  (`check_build_groups`).
- `place`: exercise 2, each axis placed on the nodes and priced in bytes (`check_placement`).
- `moe_groups`, `moe_grads`: exercises 1c and 1d, the dense and expert data-parallel groups of
  a grid with EP (`check_moe_groups`) and an MoE block's gradients reduced over them against
  one device (`check_moe_grads`).
- `practice`: exercise 3, the two practice problems (`check_fit_state`, `check_tp_vs_pp`).
- `fp8`: exercise 3b, what FP8 changes in a layer's activations, TP's and ZeRO-3's bytes and
  the state (`check_fp8`).
- `common`: the references an answer may not use, the grids, the exercise keys.

Exercise 4, the capstone, has its own module: `parlab.check.capstone`.
"""

from parlab.check.composition.fp8 import check_fp8
from parlab.check.composition.groups import BUILD_CASES, check_axis_groups, check_build_groups
from parlab.check.composition.moe_grads import check_moe_grads
from parlab.check.composition.moe_groups import check_moe_groups
from parlab.check.composition.place import check_placement
from parlab.check.composition.practice import check_fit_state, check_tp_vs_pp
from parlab.errors import CheckFailed

__all__ = ["check_axis_groups", "check_build_groups", "check_placement", "check_fit_state",
           "check_tp_vs_pp", "check_moe_groups", "check_moe_grads", "check_fp8", "BUILD_CASES",
           "CheckFailed"]
