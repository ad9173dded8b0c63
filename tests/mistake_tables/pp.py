"""Module 04. The checks that launch ranks run on the first of 2, 3 and 4 an entry fails on
(tests/mistakes.py, Table.runs); the others once. An entry's
WORLD_SIZES names the only sizes it fails on (right on 2 ranks, where both neighbours are one
rank, or where a hard-coded size happens to fit)."""

from mistakes import Table

from parlab.check import pp as ppcheck

ON_RANKS = ("check_p2p_step", "check_placement", "check_dualpipe_v")
TABLE = Table(
    module="04_pipeline_parallel",
    answers=6,
    checks={
        "check_1f1b": lambda ns, t: ppcheck.check_1f1b(ns.one_f_one_b, quiet=True),
        "check_p2p_step": lambda ns, t: ppcheck.check_p2p_step(
            ns.forward_step, ns.backward_step, ns.one_f_one_b, world_size=t, quiet=True),
        "check_placement": lambda ns, t: ppcheck.check_placement(
            ns.stage_of, ns.layers_of, world_size=t, quiet=True),
        "check_balance": lambda ns, t: ppcheck.check_balance(ns.balance, quiet=True),
        "check_dualpipe_v": lambda ns, t: ppcheck.check_dualpipe_v(
            ns.v_stage_of, ns.dualpipe_v_order, world_size=t, quiet=True),
        "check_torch_pipeline": lambda ns, t: ppcheck.check_torch_pipeline(
            ns.torch_pipeline_step, ns.one_f_one_b, ns.forward_step, ns.backward_step,
            ns.dualpipe_v_order, world_size=t, quiet=True),
    },
    # exercise 6's visible test runs 3 ranks (a rank hard-coded for p = 2 fails there)
    sizes={**{check: (2, 3, 4) for check in ON_RANKS}, "check_torch_pipeline": (3, 2, 4)},
    where={"check_1f1b": ("rank ",), "check_p2p_step": ("rank ",)},
    required=frozenset({"backward_before_forward", "missing_recv", "warmup_off_by_one",
                        "no_loss_scaling",  # the four
                        "v_looped_placement", "dualpipe_v_fixed_sizes",  # DualPipe-V's
                        # PyTorch's API (issue 45): the split against the stages' shapes, the
                        # loss_fn on one rank or none, m not dividing the batch, the wrong
                        # number of stages per rank
                        "torch_input_args_whole_batch", "torch_loss_fn_last_rank_only",
                        "torch_loss_fn_forgotten", "torch_microbatches_not_dividing",
                        "torch_v_written_in", "torch_zb_single_stage"}),
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
        "torch_step_wrapper": ("check_torch_pipeline", """
            import torch.distributed as dist
            from parlab.pp import torch_run
            def torch_pipeline_step(name, model, x, y, m, v):
                p = dist.get_world_size()
                stages = torch_run.build_stages(name, model, p, v, rank=dist.get_rank(),
                                                device=x.device)
                schedule = torch_run.make_torch_schedule(name, stages, m)
                return torch_run.torch_step(schedule, stages, x, y)
        """),
    },
)
