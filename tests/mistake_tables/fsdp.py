"""Module 01. The `check_*` entries call the checks as the visible tests do (the shards also
in float64 on 3 ranks, the plan with 10 random cases); the `hidden:<grade id>` checks run that
test cell of the solutions notebook, hidden tests included, as the grader does (so their
solutions' controls are the course run's: tests/test_mistakes.py)."""

import torch
from mistakes import Table, hidden

from parlab.check import fsdp as fsdpcheck
from parlab.check.fsdp.fully_shard import VISIBLE

MODULE = "01_memory_and_sharding"
TABLE = Table(
    module=MODULE,
    answers=4,
    checks={
        "check_state_bytes": lambda ns, t: fsdpcheck.check_state_bytes(
            ns.state_bytes, ns.practice, quiet=True),
        "check_flat_shards": lambda ns, t: fsdpcheck.check_flat_shards(
            ns.take_shard, ns.all_gather_flat, ns.reduce_scatter_flat, world_size=t,
            quiet=True),
        "check_fsdp_layer": lambda ns, t: fsdpcheck.check_fsdp_layer(
            ns.FSDPLinear, world_size=t, quiet=True),
        "check_flat_shards_float64": lambda ns, t: fsdpcheck.check_flat_shards(
            ns.take_shard, ns.all_gather_flat, ns.reduce_scatter_flat, world_size=t,
            numel=24, seed=5, dtype=torch.float64, quiet=True),  # the visible test's 2nd call
        "check_reshard_plan": lambda ns, t: fsdpcheck.check_reshard_plan(
            ns.plan_reshard, random_cases=10, seed=3, quiet=True),  # as the visible test
        "check_fully_shard": lambda ns, t: fsdpcheck.check_fully_shard(
            ns.shard_model, ns.full_grads, world_size=t, **VISIBLE[t], quiet=True),
        **{f"hidden:{gid}": hidden(MODULE, gid) for gid in (
            "state_bytes_test", "fsdp_shards_test", "fsdp_layer_test", "reshard_test",
            "fully_shard_test")},
    },
    sizes={"check_flat_shards": (2, 4), "check_fsdp_layer": (2, 4),
           "check_flat_shards_float64": (3,),
           "check_fully_shard": tuple(VISIBLE)},  # 3 ranks, then 4 with a (dp, tp) mesh
    where={check: ("rank ",) for check in (
        "check_flat_shards", "check_fsdp_layer", "check_flat_shards_float64",
        "hidden:fsdp_shards_test", "hidden:fsdp_layer_test", "check_fully_shard",
        "hidden:fully_shard_test")},
    required=frozenset({
        "grads_allreduced", "gathered_weight_kept", "shard_wrong_offset",  # issue 9
        "shard_is_view", "shard_size_hard_coded", "grads_divided_in_place",  # 16
        "state_wraps_costs", "plan_wraps_reference", "plan_sorts_sizes_in_place",
        "gathered_float32_buffers", "plan_whole_megabytes",  # 44.1: dtype, fractional sizes
        # issue 45: fully_shard's own pitfalls
        "fully_shard_root_only", "fully_shard_plan_inverted", "fully_shard_no_mesh",
        "fully_shard_no_root", "fully_shard_plan_ignored", "fully_shard_plan_reversed",
        "full_grads_dtensor", "full_grads_local_shard"}),
    reexports={
        "alias_layer": ("check_fsdp_layer", "from parlab.dp.fsdp import FSDPLinear"),
        "subclass_layer": ("check_fsdp_layer", """
            import parlab.dp.fsdp
            class FSDPLinear(parlab.dp.FSDPLinear):
                pass
        """),
        "wrapped_layer": ("check_fsdp_layer", """
            import parlab.dp.fsdp
            class FSDPLinear(nn.Module):
                def __init__(self, linear):
                    super().__init__()
                    self.inner = parlab.dp.FSDPLinear.from_linear(linear)
                def forward(self, x):
                    return self.inner(x)
        """),
        "alias_shard": ("check_flat_shards", "from parlab.dp.fsdp import take_shard"),
        "wrapped_shard": ("check_flat_shards", """
            import parlab.dp.fsdp
            def take_shard(flat, rank, t):
                return parlab.dp.take_shard(flat, rank, t)
        """),
        "wrapped_gather": ("check_flat_shards", """
            import parlab.dp.fsdp
            def all_gather_flat(shard):
                return parlab.dp.gather_flat_params(shard, numel=shard.numel() * 2)
        """),
        "alias_plan": ("check_reshard_plan", "from parlab.dp.fsdp import plan_reshard"),
        "wrapped_plan": ("check_reshard_plan", """
            import parlab.dp
            def plan_reshard(sizes, budget):
                return parlab.dp.plan_reshard(sizes, budget)
        """),
        "alias_fully_shard": ("check_fully_shard",
                              "from parlab.dp.fsdp2 import shard_stack as shard_model"),
        "wrapped_fully_shard": ("check_fully_shard", """
            import parlab.dp
            def shard_model(model, mesh, plan):
                return parlab.dp.shard_stack(model, mesh, plan)
        """),
        "alias_state": ("check_state_bytes",
                        "from parlab.costs import training_state_bytes as state_bytes"),
        "wrapped_state": ("check_state_bytes", """
            from parlab import costs
            def state_bytes(n_params, strategy, dp):
                return sum(costs.state_breakdown(n_params, strategy, dp).values())
        """),
    },
    same_refusal=(("alias_layer", "wrapped_layer"), ("alias_layer", "subclass_layer"),
                  ("alias_shard", "wrapped_shard"), ("alias_shard", "wrapped_gather"),
                  ("alias_plan", "wrapped_plan"), ("alias_state", "wrapped_state"),
                  ("alias_fully_shard", "wrapped_fully_shard")),
)
