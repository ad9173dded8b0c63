"""Module 04. The checks that launch ranks run on the first of 2, 3 and 4 an entry fails on
(tests/mistakes.py, Table.runs); the others once. An entry's
WORLD_SIZES names the only sizes it fails on (right on 2 ranks, where both neighbours are one
rank, or where a hard-coded size happens to fit)."""

from mistakes import Table

from parlab.check import pp as ppcheck

ON_RANKS = ("check_p2p_step", "check_placement", "check_dualpipe_v")
TABLE = Table(
    module="04_pipeline_parallel",
    answers=5,
    checks={
        "check_1f1b": lambda ns, t: ppcheck.check_1f1b(ns.one_f_one_b, quiet=True),
        "check_p2p_step": lambda ns, t: ppcheck.check_p2p_step(
            ns.forward_step, ns.backward_step, ns.one_f_one_b, world_size=t, quiet=True),
        "check_placement": lambda ns, t: ppcheck.check_placement(
            ns.stage_of, ns.layers_of, world_size=t, quiet=True),
        "check_balance": lambda ns, t: ppcheck.check_balance(ns.balance, quiet=True),
        "check_dualpipe_v": lambda ns, t: ppcheck.check_dualpipe_v(
            ns.v_stage_of, ns.dualpipe_v_order, world_size=t, quiet=True),
    },
    sizes={check: (2, 3, 4) for check in ON_RANKS},
    where={"check_1f1b": ("rank ",), "check_p2p_step": ("rank ",)},
    required=frozenset({"backward_before_forward", "missing_recv", "warmup_off_by_one",
                        "no_loss_scaling",  # the four
                        "v_looped_placement", "dualpipe_v_fixed_sizes"}),  # DualPipe-V's
    refusal="the course's (own )?reference",
    reexports={
        "alias": ("check_1f1b", "from parlab.pp import one_f_one_b"),
        "wrapper": ("check_1f1b", """
            def one_f_one_b(p, m):
                return make_schedule("1f1b", p, m)
        """),
        "captured": ("check_1f1b", """
            from parlab.pp import one_f_one_b as _reference
            def one_f_one_b(p, m):
                return _reference(p, m)
        """),
        "balance_alias": ("check_balance",
                          "from parlab.pp.simulator import balance_stages as balance"),
        "balance_wrapper": ("check_balance", """
            import parlab.pp.simulator
            def balance(costs, p):
                return parlab.pp.balance_stages(costs, p)
        """),
        "stage_of_wrapper": ("check_placement", """
            import parlab.pp
            def stage_of(rank, chunk, p):
                return parlab.pp.stage_of(rank, chunk, p)
        """),
        "v_stage_of_wrapper": ("check_dualpipe_v", """
            import parlab.pp
            def v_stage_of(rank, chunk, p):
                return parlab.pp.stage_of(rank, chunk, p, placement="v")
        """),
        "dualpipe_v_wrapper": ("check_dualpipe_v", """
            def dualpipe_v_order(rank, p, m):
                return make_schedule("dualpipe_v", p, m)[rank]
        """),
        "dualpipe_v_rank_alias": ("check_dualpipe_v",
                                  "from parlab.pp import dualpipe_v_rank as dualpipe_v_order"),
    },
)
