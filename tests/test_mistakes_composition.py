"""Module 07's graded checks catch the mistakes corpus, pass the solutions, reject parlab's own.

As in tests/test_mistakes_moe.py: the solutions notebook's imports cell and answer cells
(BEGIN/END SOLUTION lines dropped) run into one fresh module, not in sys.modules, so
cloudpickle ships its functions to the ranks by value, like notebook cells; a mistake file from
autograder/mistakes/07_composition/ runs on top, replacing what it defines. Each mistake file
lists in CAUGHT_BY the checks that must reject it and a phrase the message must contain.

Every check runs as its test cell does, visible and hidden calls (the hidden ones pass
quiet=True: all the cases, or for the checks on ranks the hidden sizes), except the capstone:
check_capstone runs the visible AdamW pass only (12 steps), check_capstone_hidden the hidden
runs (check_capstone(quiet=True): SGD, the only one that sees a summed gradient inside the
loop, and DP 3 × TP 2). The capstone runs and the build_groups hang (stopped by the check at
20 s) are marked slow.
"""

from __future__ import annotations

import textwrap
import types

import mistakes
import pytest
from conftest import ROOT
from mistakes import caught_by

from parlab.check import CheckFailed, reset_outcomes
from parlab.check import capstone as capcheck
from parlab.check import composition as compcheck

pytestmark = pytest.mark.usefixtures("no_orphans")
NOTEBOOK = ROOT / "solutions" / "07_composition" / "07_composition.ipynb"
MISTAKES = ROOT / "autograder" / "mistakes" / "07_composition"
T = 4  # ranks of build_groups; the capstone and sync_gradients checks always run on 4
CHECKS = {
    "check_axis_groups": lambda ns, t: compcheck.check_axis_groups(ns.axis_groups, quiet=True),
    "check_build_groups": lambda ns, t: (
        compcheck.check_build_groups(ns.build_groups, world_size=t),
        compcheck.check_build_groups(ns.build_groups, world_size=t, quiet=True)),
    "check_placement": lambda ns, t: compcheck.check_placement(
        ns.nodes_spanned, ns.bytes_per_step, quiet=True),
    "check_fit_state": lambda ns, t: compcheck.check_fit_state(ns.fit_state, quiet=True),
    "check_tp_vs_pp": lambda ns, t: compcheck.check_tp_vs_pp(ns.tp_vs_pp, quiet=True),
    "check_sync_gradients": lambda ns, t: (
        capcheck.check_sync_gradients(ns.sync_gradients),
        capcheck.check_sync_gradients(ns.sync_gradients, quiet=True)),
    "check_capstone": lambda ns, t: capcheck.check_capstone(ns.train_dp_tp, quiet=False),
    "check_capstone_hidden": lambda ns, t: capcheck.check_capstone(ns.train_dp_tp, quiet=True),
}
RANKS = {"check_build_groups", "check_sync_gradients", "check_capstone",
         "check_capstone_hidden"}  # launch ranks: their rank-level messages name the rank
SLOW = {"check_capstone", "check_capstone_hidden"}  # 8-16 s each on 2 cores
SLOW_MISTAKES = {"own_groups_only"}  # hangs until the check's 20 s timeout


def learner_namespace(*overlays: str) -> types.ModuleType:
    return mistakes.learner_namespace(NOTEBOOK, *overlays, answers=7)


def _marks(check: str, stem: str = "") -> tuple:
    return (pytest.mark.slow,) if check in SLOW or stem in SLOW_MISTAKES else ()


CASES = [pytest.param(path, check, phrase, id=f"{path.stem}-{check}", marks=_marks(check,
                                                                                    path.stem))
         for path in sorted(MISTAKES.glob("*.py")) for check, phrase in caught_by(path).items()]
SOLUTION_CHECKS = [pytest.param(c, id=c, marks=_marks(c)) for c in sorted(CHECKS)]


def test_corpus_is_complete_and_documented():
    required = {"tp_outermost", "own_groups_only", "pp_bytes_without_sp", "summed_gradients",
                "world_group_sync", "blocks_not_split", "same_rows_every_rank",
                "summed_inside_loop",
                # issue 16: sizes other than 2, TP groups that straddle nodes, the course's own
                # formulas wrapped, hints that name both mistakes giving the same ratio
                "dp_groups_of_two", "consecutive_groups_fill_nodes", "sync_divides_by_two",
                "dp_rank_from_dp", "bytes_calls_costs", "tp_vs_pp_calls_costs",
                "tp_bytes_forward_only", "layer_bytes_forward_only"}
    mistakes.assert_corpus_documented(MISTAKES, required, CHECKS)


@pytest.mark.parametrize("check", SOLUTION_CHECKS)
def test_solutions_pass(check):
    CHECKS[check](learner_namespace(), T)


@pytest.mark.parametrize("path, check, phrase", CASES)
def test_mistake_is_caught_with_a_pointer(path, check, phrase):
    ns = learner_namespace(path.read_text())
    message = mistakes.caught_message(lambda: CHECKS[check](ns, T), phrase=phrase,
                                      where=f"{path.name} under {check} on {T} ranks")
    if check in RANKS and "hung" not in message and "single device" not in message:
        assert "rank " in message  # a rank-level comparison names the rank (the capstone's
        # losses are global means, the same on every rank: their comparison names none)


REEXPORTS = {  # how an answer could hand back parlab's own code -> the check that must refuse
    "wrapped_axis_groups": ("""
        import parlab.mesh
        def axis_groups(world_size, sizes, axis):
            return parlab.mesh.make_mesh(world_size, **sizes).groups(axis)
    """, "check_axis_groups"),
    "wrapped_build_groups": ("""
        from parlab.mesh import make_mesh, new_groups
        def build_groups(sizes):
            mesh = make_mesh(dist.get_world_size(), **sizes)
            return new_groups(mesh, axes=tuple(sizes))
    """, "check_build_groups"),
    "wrapped_nodes_spanned": ("""
        import types
        import parlab.plan.costs
        def nodes_spanned(groups, gpus_per_node):
            grid = torch.tensor(groups).view(len(groups), 1, 1, 1, -1)  # lines along "tp"
            mesh = types.SimpleNamespace(grid=grid)
            return parlab.plan.nodes_spanned(mesh, ("tp",), gpus_per_node)
    """, "check_placement"),
    "alias_sync": ("from parlab.capstone import sync_gradients", "check_sync_gradients"),
    "wrapped_fit_state": ("""
        from parlab import costs
        def fit_state(n_params, n_gpus, gpu_bytes, gpus_per_node):
            replica = costs.training_state_bytes(n_params, "ddp", 1)
            return {"replica_bytes": replica, "dp_fits": replica <= gpu_bytes,
                    "zero3_bytes": costs.training_state_bytes(n_params, "zero3", n_gpus),
                    "tp": gpus_per_node, "dp": n_gpus // gpus_per_node,
                    "tp_only_bytes": replica / gpus_per_node}
    """, "check_fit_state"),
    "wrapped_bytes_per_step": ("""
        from parlab.plan import Model, Shape, axis_bytes
        def bytes_per_step(n_params, layers, hidden, seq, *, b, m, tp, pp, dp):
            model = Model("mine", n_params, layers, hidden, 64, seq)
            out = axis_bytes(model, Shape(dp, pp, 1, 1, tp), strategy="ddp", micro_batch=b,
                             microbatches=m)
            return {axis: out[axis] for axis in ("tp", "pp", "dp")}
    """, "check_placement"),
    "wrapped_train": ("""
        def train_dp_tp(cfg, steps, *, dp, tp, batch_size, lr, progress_file=None):
            return train_parallel(cfg, steps, dp=dp, tp=tp, batch_size=batch_size, lr=lr,
                                  progress_file=progress_file)
    """, "check_capstone"),
}


@pytest.mark.parametrize("how", sorted(REEXPORTS))
def test_reference_implementation_is_rejected(how):
    source, check = REEXPORTS[how]
    ns = learner_namespace(textwrap.dedent(source))
    with pytest.raises(CheckFailed, match="the course's own|parlab.capstone's"):
        CHECKS[check](ns, T)


@pytest.mark.slow
def test_capstone_says_when_build_groups_failed():
    """Issue 15.3: the capstone runs the learner's own build_groups; when that failed its own
    check earlier in the kernel, the capstone's message starts by saying so."""

    ns = learner_namespace((MISTAKES / "tp_outermost.py").read_text())
    reset_outcomes()
    with pytest.raises(CheckFailed, match="TP is the innermost axis"):
        compcheck.check_build_groups(ns.build_groups, world_size=T)
    with pytest.raises(CheckFailed, match=r"builds on your build_groups \(exercise 1b\), which "
                                          r"failed its own test above: fix that first"):
        capcheck.check_capstone(ns.train_dp_tp)
    reset_outcomes()
