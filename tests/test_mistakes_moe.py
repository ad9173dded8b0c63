"""Module 06's graded checks catch the mistakes corpus, pass the solutions, reject parlab's own.

As in tests/test_mistakes_sp.py: the solutions notebook's imports cell and answer cells
(BEGIN/END SOLUTION lines dropped) run into one fresh module, not in sys.modules, so
cloudpickle ships its functions to the ranks by value, like notebook cells; a mistake file from
autograder/mistakes/06_expert_parallel/ runs on top, replacing what it defines. Each mistake
file lists in CAUGHT_BY the checks that must reject it and a phrase the message must contain.
"""

from __future__ import annotations

import textwrap
import types

import mistakes
import pytest
from conftest import ROOT

from parlab.check import CheckFailed, reset_outcomes
from parlab.check import moe as moecheck

pytestmark = pytest.mark.usefixtures("no_orphans")
NOTEBOOK = ROOT / "solutions" / "06_expert_parallel" / "06_expert_parallel.ipynb"
MISTAKES = ROOT / "autograder" / "mistakes" / "06_expert_parallel"
LOCAL = {"check_router", "check_capacity"}  # run in this process: no world size
HIDDEN = {"check_ep_moe_hidden", "check_ep_capacity_hidden"}  # the hidden cells: sizes fixed
CHECKS = {
    "check_router": lambda ns, t: moecheck.check_router(ns.router, quiet=True),
    "check_capacity": lambda ns, t: moecheck.check_capacity(ns.expert_capacity, ns.keep_mask,
                                                            quiet=True),
    "check_ep_moe": lambda ns, t: moecheck.check_ep_moe(ns.ep_moe, world_size=t, quiet=True),
    "check_ep_capacity": lambda ns, t: moecheck.check_ep_capacity(ns.ep_moe_capacity,
                                                                  world_size=t, quiet=True),
    # the hidden test cells' second call: 3 ranks, 3 experts each (a fractional capacity)
    "check_ep_moe_hidden": lambda ns, t: moecheck.check_ep_moe(
        ns.ep_moe, world_size=3, experts_per_rank=3, quiet=True),
    "check_ep_capacity_hidden": lambda ns, t: moecheck.check_ep_capacity(
        ns.ep_moe_capacity, world_size=3, experts_per_rank=3, capacity_factor=1.25,
        quiet=True),
}


def learner_namespace(*overlays: str) -> types.ModuleType:
    return mistakes.learner_namespace(NOTEBOOK, *overlays, answers=4)


def _sizes(check: str) -> tuple[int, ...]:
    return (2,) if check in LOCAL else (3,) if check in HIDDEN else (2, 4)


CASES = mistakes.cases(MISTAKES, _sizes)


def test_corpus_is_complete_and_documented():
    required = {"combine_without_gates", "split_sizes_not_exchanged", "dropped_not_residual",
                "wrong_expert_placement",  # issue 8
                # issue 16: 3 experts per rank, fractional capacities, inputs modified in
                # place, a receive buffer of the wrong dtype
                "two_experts_per_rank", "capacity_rounded", "keep_mask_marks_experts",
                "counts_received_as_float"}
    mistakes.assert_corpus_documented(MISTAKES, required, CHECKS)


@pytest.mark.parametrize("check, t", [(c, t) for c in sorted(CHECKS) for t in _sizes(c)])
def test_solutions_pass(check, t):
    CHECKS[check](learner_namespace(), t)


@pytest.mark.parametrize("path, check, phrase, t", CASES)
def test_mistake_is_caught_with_a_pointer(path, check, phrase, t):
    ns = learner_namespace(path.read_text())
    message = mistakes.caught_message(lambda: CHECKS[check](ns, t), phrase=phrase,
                                      where=f"{path.name} under {check} on {t} ranks")
    if check not in LOCAL:
        assert "rank " in message  # every message from a rank-level comparison names the rank


REEXPORTS = {  # how an answer could hand back parlab's own code -> the check that must refuse
    "alias_router": ("from parlab.moe import route as router", "check_router"),
    "wrapped_router": ("""
        import parlab.moe
        def router(x, weight, k):
            gates, experts, probs = parlab.moe.route(x, weight, k=k)
            return gates, experts, parlab.moe.balance_loss(probs, experts,
                                                           num_experts=weight.shape[0])
    """, "check_router"),
    "alias_keep": ("from parlab.moe import keep_mask", "check_capacity"),
    "wrapped_keep": ("""
        from parlab.moe import keep_mask as _reference_keep
        def keep_mask(experts, num_experts, capacity):
            return _reference_keep(experts, num_experts=num_experts, capacity=capacity)
    """, "check_capacity"),
    "alias_ep": ("from parlab.moe.dispatch import ep_moe", "check_ep_moe"),
    "wrapped_ep": ("""
        import parlab.moe.dispatch
        def ep_moe(x, gates, experts, shard):
            return parlab.moe.ep_moe(x, gates, experts, shard)
    """, "check_ep_moe"),
    "wrapped_capacity": ("""
        from parlab.moe import dispatch as moe_dispatch
        def ep_moe_capacity(x, gates, experts, shard, capacity):
            return moe_dispatch.ep_moe_capacity(x, gates, experts, shard, capacity=capacity)
    """, "check_ep_capacity"),
    "wrapped_all_to_all": ("""
        from parlab.moe import AllToAll
    """, "check_ep_moe"),
}


@pytest.mark.parametrize("how", sorted(REEXPORTS))
def test_reference_implementation_is_rejected(how):
    source, check = REEXPORTS[how]
    ns = learner_namespace(textwrap.dedent(source))
    with pytest.raises(CheckFailed, match="the course's own reference|parlab's own MoE reference"):
        CHECKS[check](ns, 2)


def test_ep_capacity_says_when_keep_mask_failed():
    """Issue 15.3: exercise 4 runs the learner's own keep_mask; when exercise 2's check failed
    earlier in the kernel, exercise 4's message starts by saying so."""

    ns = learner_namespace((MISTAKES / "keep_token_major.py").read_text())
    reset_outcomes()
    with pytest.raises(CheckFailed, match="serve the assignments choice first"):
        CHECKS["check_capacity"](ns, 2)
    with pytest.raises(CheckFailed, match=r"builds on your expert_capacity and keep_mask "
                                          r"\(exercise 2\), which failed its own test above"):
        CHECKS["check_ep_capacity"](ns, 2)
    reset_outcomes()
