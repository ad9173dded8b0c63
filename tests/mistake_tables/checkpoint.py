"""Module 09. The checks run as the visible tests call them (the hidden ones add cases; every
entry of the corpus must fail the visible test). check_reshard's reference is
torch.distributed.checkpoint on 4 ranks, about 6 s, once: the check keeps DCP's pieces of each
case for the process's life, so the later cases start no ranks (t is unused: 1). check_policy
starts no ranks (its reference is a numeric minimisation, in-process)."""

from mistakes import Table

from parlab.check import checkpoint as ckcheck
from parlab.check import checkpoint_policy as policycheck

TABLE = Table(
    module="09_checkpoints_and_restarts",
    answers=2,
    checks={"check_reshard": lambda ns, t: ckcheck.check_reshard(ns.reshard),
            "check_policy": lambda ns, t: policycheck.check_policy(ns.choose_policy)},
    sizes={"check_reshard": (1,), "check_policy": (1,)},
    required=frozenset({"weight_only", "wrong_dim", "split_in_two", "views_of_whole",
                        "modifies_input", "reversed_order", "returns_one_tensor",
                        "policy_interval_in_minutes", "policy_no_factor_two",
                        "policy_restart_ignored", "policy_always_async",
                        "policy_async_whole_save", "dtype_lost",  # 44.1
                        "policy_async_not_held_by_write"}),
    slow_solutions=frozenset({"check_reshard"}),
    refusal="the course's own",
    reexports={
        "wrapped_reshard_pieces": ("check_reshard", """
            from parlab.compose import reshard_pieces
            def reshard(pieces, dim, t_new):
                parts = {k: reshard_pieces([p[k] for p in pieces], dim, t_new) for k in pieces[0]}
                return [{k: parts[k][r] for k in parts} for r in range(t_new)]
        """),
        "alias_reshard_pieces": ("check_reshard",
                                 "from parlab.compose import reshard_pieces as reshard"),
        "dcp_load": ("check_reshard", """
            import torch.distributed.checkpoint as dcp
            def reshard(pieces, dim, t_new):
                dcp.load({}, checkpoint_id="/nonexistent")
        """),
        "dtensor_redistribute": ("check_reshard", """
            from torch.distributed.tensor import DTensor
            def reshard(pieces, dim, t_new):
                return DTensor.redistribute(pieces[0]["weight"])
        """),
        "wrapped_best_policy": ("check_policy", """
            from parlab import costs
            def choose_policy(mtbf_s, sync_save_s, async_stall_s, async_write_s, restart_s):
                p = costs.best_policy(mtbf=mtbf_s, sync_save=sync_save_s,
                                      async_stall=async_stall_s, async_write=async_write_s,
                                      restart=restart_s)
                return p.interval, p.mode, p.overhead
        """),
        "overhead_from_costs": ("check_policy", """
            import math
            from parlab.costs import checkpoint_overhead
            def choose_policy(mtbf_s, sync_save_s, async_stall_s, async_write_s, restart_s):
                tau = math.sqrt(2 * async_stall_s * mtbf_s)
                return tau, "async", checkpoint_overhead(
                    tau, mtbf=mtbf_s, save_stall=async_stall_s, restart=restart_s)
        """),
    },
)
