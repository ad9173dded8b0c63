"""Module 06. The router and capacity checks run in this process; the rank checks on the
first of 2 and 4 ranks an entry fails on (tests/mistakes.py, Table.runs), and as the visible
test cells' other calls do: each token routed to 3 experts (exercise 3) or 1 (exercise 4), on
2 ranks; 3 ranks, 3 experts each (a fractional capacity in exercise 4)."""

from mistakes import Table

from parlab.check import moe as moecheck

ON_RANKS = ("check_ep_moe", "check_ep_capacity")
THREE = ("check_ep_moe_three_per_rank", "check_ep_capacity_three_per_rank")  # on 3 ranks
TOP_K = ("check_ep_moe_top_k", "check_ep_capacity_top_k")  # theirs: 2
TABLE = Table(
    module="06_expert_parallel",
    answers=4,
    checks={
        "check_router": lambda ns, t: moecheck.check_router(ns.router, quiet=True),
        "check_capacity": lambda ns, t: moecheck.check_capacity(
            ns.expert_capacity, ns.keep_mask, quiet=True),
        "check_ep_moe": lambda ns, t: moecheck.check_ep_moe(ns.ep_moe, world_size=t,
                                                            quiet=True),
        "check_ep_capacity": lambda ns, t: moecheck.check_ep_capacity(
            ns.ep_moe_capacity, world_size=t, quiet=True),
        "check_ep_moe_three_per_rank": lambda ns, t: moecheck.check_ep_moe(
            ns.ep_moe, world_size=3, experts_per_rank=3, quiet=True),
        "check_ep_capacity_three_per_rank": lambda ns, t: moecheck.check_ep_capacity(
            ns.ep_moe_capacity, world_size=3, experts_per_rank=3, capacity_factor=1.25,
            quiet=True),
        "check_ep_moe_top_k": lambda ns, t: moecheck.check_ep_moe(
            ns.ep_moe, world_size=2, top_k=3, quiet=True),
        "check_ep_capacity_top_k": lambda ns, t: moecheck.check_ep_capacity(
            ns.ep_moe_capacity, world_size=2, top_k=1, quiet=True),
    },
    sizes={**{check: (2, 4) for check in ON_RANKS}, **{check: (3,) for check in THREE},
           **{check: (2,) for check in TOP_K}},
    where={check: ("rank ",) for check in (*ON_RANKS, *THREE, *TOP_K)},
    required=frozenset({
        "combine_without_gates", "split_sizes_not_exchanged", "dropped_not_residual",
        "wrong_expert_placement",  # issue 8
        # issue 16: 3 experts per rank, fractional capacities, inputs modified in place, a
        # receive buffer of the wrong dtype
        "two_experts_per_rank", "capacity_rounded", "keep_mask_marks_experts",
        "counts_received_as_float",
        "ep_top_k_hard_coded", "capacity_top_k_hard_coded",  # 32.6: k = 2 written in
        "capacity_two_experts_per_rank"}),  # 44.1: 3 experts per rank in the visible tests
    refusal="the course's own reference|parlab's own MoE reference",
    reexports={
        "alias_router": ("check_router", "from parlab.moe import route as router"),
        "wrapped_router": ("check_router", """
            import parlab.moe
            def router(x, weight, k):
                gates, experts, probs = parlab.moe.route(x, weight, k=k)
                return gates, experts, parlab.moe.balance_loss(probs, experts,
                                                               num_experts=weight.shape[0])
        """),
        "alias_keep": ("check_capacity", "from parlab.moe import keep_mask"),
        "wrapped_keep": ("check_capacity", """
            from parlab.moe import keep_mask as _reference_keep
            def keep_mask(experts, num_experts, capacity):
                return _reference_keep(experts, num_experts=num_experts, capacity=capacity)
        """),
        "alias_ep": ("check_ep_moe", "from parlab.moe.dispatch import ep_moe"),
        "wrapped_ep": ("check_ep_moe", """
            import parlab.moe.dispatch
            def ep_moe(x, gates, experts, shard):
                return parlab.moe.ep_moe(x, gates, experts, shard)
        """),
        "wrapped_capacity": ("check_ep_capacity", """
            from parlab.moe import dispatch as moe_dispatch
            def ep_moe_capacity(x, gates, experts, shard, capacity):
                return moe_dispatch.ep_moe_capacity(x, gates, experts, shard, capacity=capacity)
        """),
        "wrapped_all_to_all": ("check_ep_moe", "from parlab.moe import AllToAll"),
    },
)
