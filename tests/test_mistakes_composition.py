"""Module 07's graded checks catch the mistakes corpus, pass the solutions, reject parlab's own.

As in tests/test_mistakes_moe.py: the solutions notebook's imports cell and answer cells
(BEGIN/END SOLUTION lines dropped) run into one fresh module, not in sys.modules, so
cloudpickle ships its functions to the ranks by value, like notebook cells; a mistake file from
autograder/mistakes/07_composition/ runs on top, replacing what it defines. Each mistake file
lists in CAUGHT_BY the checks that must reject it and a phrase the message must contain.

Every check runs as the hidden test does (quiet=True: all the cases), except check_capstone,
which runs the visible AdamW pass only (12 steps); check_capstone_hidden adds the SGD pass
(check_capstone(quiet=True)), the only one that sees a summed gradient inside the loop. The
number of ranks matters only to build_groups: 4 here. The capstone runs and the build_groups
hang (stopped by the check at 10 s) are marked slow.
"""

from __future__ import annotations

import textwrap
import types

import mistakes
import pytest
from conftest import ROOT
from mistakes import caught_by

from parlab.check import CheckFailed
from parlab.check import capstone as capcheck
from parlab.check import composition as compcheck
from parlab.check import composition_place as placecheck

pytestmark = pytest.mark.usefixtures("no_orphans")
NOTEBOOK = ROOT / "solutions" / "07_composition" / "07_composition.ipynb"
MISTAKES = ROOT / "autograder" / "mistakes" / "07_composition"
T = 4  # ranks of build_groups; the capstone and sync_gradients checks always run on 4
CHECKS = {
    "check_axis_groups": lambda ns, t: compcheck.check_axis_groups(ns.axis_groups, quiet=True),
    "check_build_groups": lambda ns, t: compcheck.check_build_groups(
        ns.build_groups, world_size=t, quiet=True),
    "check_placement": lambda ns, t: placecheck.check_placement(
        ns.nodes_spanned, ns.bytes_per_step, quiet=True),
    "check_fit_state": lambda ns, t: compcheck.check_fit_state(ns.fit_state, quiet=True),
    "check_tp_vs_pp": lambda ns, t: compcheck.check_tp_vs_pp(ns.tp_vs_pp, quiet=True),
    "check_sync_gradients": lambda ns, t: capcheck.check_sync_gradients(ns.sync_gradients,
                                                                        quiet=True),
    "check_capstone": lambda ns, t: capcheck.check_capstone(ns.train_dp_tp, quiet=False),
    "check_capstone_hidden": lambda ns, t: capcheck.check_capstone(ns.train_dp_tp, quiet=True),
}
RANKS = {"check_build_groups", "check_sync_gradients", "check_capstone",
         "check_capstone_hidden"}  # launch ranks: their rank-level messages name the rank
SLOW = {"check_capstone", "check_capstone_hidden"}  # 8-16 s each on 2 cores
SLOW_MISTAKES = {"own_groups_only"}  # hangs until the check's 10 s timeout


def learner_namespace(*overlays: str) -> types.ModuleType:
    return mistakes.learner_namespace(NOTEBOOK, *overlays, answers=7)


def _marks(check: str, stem: str = "") -> tuple:
    return (pytest.mark.slow,) if check in SLOW or stem in SLOW_MISTAKES else ()


CASES = [pytest.param(path, check, phrase, id=f"{path.stem}-{check}", marks=_marks(check,
                                                                                    path.stem))
         for path in sorted(MISTAKES.glob("*.py")) for check, phrase in caught_by(path).items()]
# check_capstone_hidden runs the AdamW pass too: the solutions' capstone runs once, not twice
SOLUTION_CHECKS = [pytest.param(c, id=c, marks=_marks(c))
                   for c in sorted(CHECKS) if c != "check_capstone"]


def test_corpus_is_complete_and_documented():
    required = {"tp_outermost", "own_groups_only", "pp_bytes_without_sp", "summed_gradients",
                "world_group_sync", "blocks_not_split", "same_rows_every_rank",
                "summed_inside_loop"}
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
