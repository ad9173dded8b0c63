"""Module 07. Every check runs as its test cell does, the visible call and then the hidden one
(quiet=True: all the cases, or for the checks on ranks the hidden sizes), on T = 4 ranks for
build_groups. A mistake must be caught by the visible call, with its phrase: what standing()
and Validate run never gives full marks to an answer the grader fails (issue 44); an entry
only the hidden call catches fails its test, saying so (`visible_first`). The capstone runs
(8-16 s each on 2 cores) are marked slow. A rank-level message names the rank; a hang, and the
capstone's losses (global means, the same on every rank: compared with the single device),
name none."""

from mistakes import Table

from parlab.check import CheckFailed
from parlab.check import capstone as capcheck
from parlab.check import composition as compcheck
from parlab.launch import RankError

T = 4  # ranks of build_groups; the capstone and sync_gradients checks always run on 4
TIMEOUT = 8.0  # the launcher's timeout here: a hang it cannot prove costs 8 s, not 20


def visible_first(visible, hidden):
    """The test cell's visible call, then its hidden one; a mistake that passes the visible
    call and fails the hidden one is a hole in the visible test, reported as such."""
    def run(ns, t):
        visible(ns, t)
        try:
            hidden(ns, t)
        except (CheckFailed, RankError) as exc:
            raise AssertionError(f"only the hidden test catches it:\n{exc}") from None
    return run


CHECKS = {
    "check_axis_groups": visible_first(
        lambda ns, t: compcheck.check_axis_groups(ns.axis_groups),
        lambda ns, t: compcheck.check_axis_groups(ns.axis_groups, quiet=True)),
    "check_build_groups": visible_first(
        lambda ns, t: compcheck.check_build_groups(ns.build_groups, world_size=t,
                                                   timeout=TIMEOUT),
        lambda ns, t: compcheck.check_build_groups(ns.build_groups, world_size=t, quiet=True,
                                                   timeout=TIMEOUT)),
    "check_placement": visible_first(
        lambda ns, t: compcheck.check_placement(ns.nodes_spanned, ns.bytes_per_step),
        lambda ns, t: compcheck.check_placement(ns.nodes_spanned, ns.bytes_per_step,
                                                quiet=True)),
    "check_fit_state": visible_first(
        lambda ns, t: compcheck.check_fit_state(ns.fit_state),
        lambda ns, t: compcheck.check_fit_state(ns.fit_state, quiet=True)),
    "check_tp_vs_pp": visible_first(
        lambda ns, t: compcheck.check_tp_vs_pp(ns.tp_vs_pp),
        lambda ns, t: compcheck.check_tp_vs_pp(ns.tp_vs_pp, quiet=True)),
    "check_moe_groups": visible_first(
        lambda ns, t: compcheck.check_moe_groups(ns.moe_groups, timeout=TIMEOUT),
        lambda ns, t: compcheck.check_moe_groups(ns.moe_groups, quiet=True, timeout=TIMEOUT)),
    "check_moe_grads": visible_first(
        lambda ns, t: compcheck.check_moe_grads(ns.moe_groups, ns.reduce_moe_grads,
                                                timeout=TIMEOUT),
        lambda ns, t: compcheck.check_moe_grads(ns.moe_groups, ns.reduce_moe_grads,
                                                quiet=True, timeout=TIMEOUT)),
    "check_fp8": visible_first(
        lambda ns, t: compcheck.check_fp8(ns.precision_costs),
        lambda ns, t: compcheck.check_fp8(ns.precision_costs, quiet=True)),
    "check_sync_gradients": visible_first(
        lambda ns, t: capcheck.check_sync_gradients(ns.sync_gradients),
        lambda ns, t: capcheck.check_sync_gradients(ns.sync_gradients, quiet=True)),
    "check_capstone": visible_first(
        lambda ns, t: capcheck.check_capstone(ns.train_dp_tp, quiet=False),
        lambda ns, t: capcheck.check_capstone(ns.train_dp_tp, quiet=True)),
}
TABLE = Table(
    module="07_composition",
    answers=10,
    checks=CHECKS,
    sizes={check: (T,) for check in CHECKS},
    # these run exactly as their test cells do, which the course run runs on the solutions
    # (tests/test_notebooks.py (a)): no second passing control here
    solution_sizes={check: () for check in (
        "check_build_groups", "check_moe_groups", "check_moe_grads", "check_sync_gradients",
        "check_capstone")},
    where={check: ("rank ",) for check in (
        "check_build_groups", "check_moe_groups", "check_moe_grads", "check_sync_gradients",
        "check_capstone")},
    where_exempt=("hung", "single device"),
    slow_checks=frozenset({"check_capstone"}),
    required=frozenset({
        "tp_outermost", "own_groups_only", "pp_bytes_without_sp", "summed_gradients",
        "world_group_sync", "blocks_not_split", "same_rows_every_rank", "summed_inside_loop",
        # issue 16: sizes other than 2, TP groups that straddle nodes, the course's own
        # formulas wrapped, hints that name both mistakes giving the same ratio
        "dp_groups_of_two", "consecutive_groups_fill_nodes", "sync_divides_by_two",
        "dp_rank_from_dp", "bytes_calls_costs", "tp_vs_pp_calls_costs",
        "tp_bytes_forward_only", "layer_bytes_forward_only",
        # issue 33: MoE in the grid, the dense and expert data-parallel groups
        "moe_experts_over_dense_group", "moe_expert_mean_over_copies", "moe_skips_none_grads",
        "moe_dense_over_dp_only", "moe_groups_forget_cp", "moe_groups_tp_outermost",
        # issue 33, item 6: what FP8 changes, computed
        "fp8_reduce_scatters_in_fp8", "fp8_master_weights", "fp8_all_activations_halved",
        "fp8_bf16_one_byte", "fp8_ring_fraction_forgotten",
        # issue 44: what a right answer must not depend on, varied by the visible tests; TP +
        # SP's backward re-gathers
        "moe_divides_by_world", "m_float_ceil", "fit_state_fixed_answers",
        "moe_groups_own_only", "fp8_four_all_gathers"}),
    refusal="the course's own|parlab.capstone's",
    reexports={
        "wrapped_axis_groups": ("check_axis_groups", """
            import parlab.mesh
            def axis_groups(world_size, sizes, axis):
                return parlab.mesh.make_mesh(world_size, **sizes).groups(axis)
        """),
        "wrapped_build_groups": ("check_build_groups", """
            from parlab.mesh import make_mesh, new_groups
            def build_groups(sizes):
                mesh = make_mesh(dist.get_world_size(), **sizes)
                return new_groups(mesh, axes=tuple(sizes))
        """),
        "wrapped_nodes_spanned": ("check_placement", """
            import types
            import parlab.plan.costs
            def nodes_spanned(groups, gpus_per_node):
                grid = torch.tensor(groups).view(len(groups), 1, 1, 1, -1)  # lines along "tp"
                mesh = types.SimpleNamespace(grid=grid)
                return parlab.plan.nodes_spanned(mesh, ("tp",), gpus_per_node)
        """),
        "alias_sync": ("check_sync_gradients", "from parlab.capstone import sync_gradients"),
        "wrapped_moe_groups": ("check_moe_groups", """
            from parlab.compose.grid import make_grid
            def moe_groups(sizes):
                grid = make_grid(**sizes)
                return {"dense": grid.dp, "expert": grid.expert_dp}
        """),
        "wrapped_reduce_moe_grads": ("check_moe_grads", """
            from parlab.compose import sum_grads
            def reduce_moe_grads(dense, experts, groups):
                n = dist.get_world_size(groups["dense"])
                sum_grads(dense, group=groups["dense"], scale=1 / n)
                sum_grads(experts, group=groups["expert"], scale=1 / n)
        """),
        "wrapped_fit_state": ("check_fit_state", """
            from parlab import costs
            def fit_state(n_params, n_gpus, gpu_bytes, gpus_per_node):
                replica = costs.training_state_bytes(n_params, "ddp", 1)
                return {"replica_bytes": replica, "dp_fits": replica <= gpu_bytes,
                        "zero3_bytes": costs.training_state_bytes(n_params, "zero3", n_gpus),
                        "tp": gpus_per_node, "dp": n_gpus // gpus_per_node,
                        "tp_only_bytes": replica / gpus_per_node}
        """),
        "wrapped_bytes_per_step": ("check_placement", """
            from parlab.plan import Model, Shape, axis_bytes
            def bytes_per_step(n_params, layers, hidden, seq, *, b, m, tp, pp, dp):
                model = Model("mine", n_params, layers, hidden, 64, seq)
                out = axis_bytes(model, Shape(dp, pp, 1, 1, tp), strategy="ddp",
                                 micro_batch=b, microbatches=m)
                return {axis: out[axis] for axis in ("tp", "pp", "dp")}
        """),
        "wrapped_precision_costs": ("check_fp8", """
            from parlab import costs
            def precision_costs(b, s, h, t, d, n_params, *, precision):
                tp = costs.tp_bytes_by_collective(b, s, h, t, precision=precision)
                zero3 = costs.fsdp_bytes_by_collective(n_params, d, precision=precision)
                return {"activations": costs.activation_bytes_per_layer(
                            b, s, h, 1, t, sp=True, keep_scores=False, precision=precision),
                        "tp_all_gather": tp["all-gather"],
                        "tp_reduce_scatter": tp["reduce-scatter"],
                        "zero3_all_gather": zero3["all-gather"],
                        "zero3_reduce_scatter": zero3["reduce-scatter"],
                        "state": 16 * n_params / d}
        """),
        "wrapped_train": ("check_capstone", """
            def train_dp_tp(cfg, steps, *, dp, tp, batch_size, lr, progress_file=None):
                return train_parallel(cfg, steps, dp=dp, tp=tp, batch_size=batch_size, lr=lr,
                                      progress_file=progress_file)
        """),
    },
)
